"""FSA in a ``lan: collective`` party: the party's gradients meet in reduce-scatters that overlap backward, each
rank syncs the slices it owns with the global servers over its own connection, all-gathers bring every owner's
answers home.

Per step, as data: each gradient, as backward makes it -> its bucket (keys deepest first, about 25 MB each, as
DDP's); a complete bucket -> (LAN, torch.distributed, in the background) reduce-scatter: rank r holds the party's
sum of the bucket's slices it owns -> (WAN) one push per owned slice to the global server holding it, which sums
over parties (one contributor per party per slice, as a local server would be) -> the answer (new weights, or the
global sum of gradients when the optimizer runs on the workers) into the same buffer -> (LAN) all-gather -> every
rank's parameters (or gradients, then the wrapped optimizer steps on their mean). Buckets start in one order on
every rank (a bucket waits for the ones before it), so the collectives match. A script's own DDP around the model
communicates nothing (``geomx.collective.ddp.keep_local``): this path is the party's average.

Over gloo a bucket's answers land, and its all-gather starts, as soon as they are all in, while backward still
computes later buckets (checked from the gradient hooks), so that after backward only the last buckets' rounds
remain, as only DDP's last all-reduces do. Those all-gathers number their rank-to-rank messages in a lane of tags
of their own (``PartyGroup``), so they need not come in the same order as the reduce-scatters on every rank.
On NCCL every collective of a group must come in one order: there the answers land after backward.

Usage (chosen by the wrapper for a collective party's plan)::

    strategy = CollectiveServerStep(loop)      # or CollectiveLocalStep: the optimizer on every rank
    strategy.on_gradient(key, grad)            # from backward's hooks
    strategy.step()                            # after backward
"""

from __future__ import annotations

import time
from typing import Any

import torch

from ...collective.ddp import keep_local
from ...collective.group import Pending
from ...collective.host import HostChunk
from ...collective.owners import OwnedSlice
from ...collective.party_model import WholePartyModel, backward_buckets, bucket_like
from ...core.strategy import AveragedStep, Loop, WorkerStrategy
from .strategy import refused_average, warn_no_gradient


class CollectiveServerStep(WorkerStrategy):
    """The global servers run the optimizer and answer with new weights."""

    pushes_gradients = True
    same_model_everywhere = True  # every rank holds the whole model, each step the same round's (FSA)

    def __init__(self, loop: Loop, bucket_bytes: int | None = None) -> None:
        super().__init__(loop)
        # training.bucket_mb / GEOMX_BUCKET_MB
        self.bucket_bytes = bucket_bytes if bucket_bytes is not None else loop.kv.config.topology.training.bucket_bytes
        self.buckets: list[WholePartyModel] = []
        self.stages: list[HostChunk] = []  # each bucket's owned chunk on the host (itself on the CPU; pinned on CUDA)
        self.bucket_of: dict[int, int] = {}
        self.missing: list[set[int]] = []  # per bucket: trained keys whose gradient has not come this step
        self.started: list[Pending] = []  # the reduce-scatters started this step, in bucket order
        self.sent: list[tuple[list[tuple[OwnedSlice, torch.Tensor]], list[Any]]] = []  # pushed: pieces, futures
        self.gathers: list[Pending] = []  # the all-gathers of the landed buckets' answers, in bucket order

    def init_keys(self) -> None:
        loop = self.loop
        ranks = loop.ranks
        if loop.ddp is not None:  # the script's DDP: its all-reduce would repeat this path's reduce-scatter
            keep_local(loop.ddp, ranks.group.party)
        like = bucket_like(loop.params)  # the model's dtype (the widest, where it mixes some)
        numels = {key: p.numel() for key, p in enumerate(loop.params)}
        for keys in backward_buckets(numels, like.element_size(), self.bucket_bytes):
            for key in keys:
                self.bucket_of[key] = len(self.buckets)
            # rank to rank (gloo), the reduce-scatter sums into this rank's part of the bucket and the all-gather
            # sends from there: no chunk of its own, no copy of it per step
            self.buckets.append(WholePartyModel(ranks.layout(keys), ranks.group, like=like,
                                                in_place=ranks.group.direct))
            self.stages.append(HostChunk(self.buckets[-1].chunk, self.buckets[-1].pieces))
        self.trained = set(loop.trained)
        self._new_step()

    def _new_step(self) -> None:
        self.missing = [{k for k in bucket.layout.keys if k in self.trained} for bucket in self.buckets]
        self.started = []
        self.sent = []
        self.gathers = []

    def on_gradient(self, key: int, grad: torch.Tensor) -> None:
        index = self.bucket_of[key]
        bucket = self.buckets[index]
        bucket.layout.pack_key(key, grad, bucket.buffer)
        self.missing[index].discard(key)
        self.loop.pushed.add(key)
        self._start_ready()
        self._send_ready(block=False)
        if self.buckets[index].group.direct:
            self._land_ready(block=False)

    def _start_ready(self) -> None:
        """Start the reduce-scatter of every complete bucket whose predecessors have started."""
        while len(self.started) < len(self.buckets) and not self.missing[len(self.started)]:
            bucket = self.buckets[len(self.started)]
            self.started.append(bucket.group.reduce_scatter_async(bucket.chunk, bucket.buffer))

    def _send_ready(self, block: bool) -> None:
        """Push the owned slices of every bucket whose reduce-scatter is done, in bucket order (``block``: wait
        for each started one): from backward's hooks, a bucket's WAN round starts while later buckets still
        compute."""
        ranks = self.loop.ranks
        while len(self.sent) < len(self.started):
            scatter = self.started[len(self.sent)]
            if not block and not scatter.done():
                return
            scatter.wait()  # raises, naming the party, if the reduce-scatter failed
            stage = self.stages[len(self.sent)]
            stage.down()  # the owned sums to the host, in one copy
            pieces = [(owned, piece) for owned, piece in stage.pieces if owned.key in self.trained]
            self.sent.append((pieces, ranks.send(pieces, self.loop.priority)))

    def _land_ready(self, block: bool) -> None:
        """Write the answers of every pushed bucket whose answers are all in into it and start its all-gather, in
        bucket order (``block``: wait for each pushed one). From backward's hooks, nothing waits: a bucket whose
        answers are not all in (or one failed: ``step`` raises it) stops the walk until the next gradient."""
        ranks = self.loop.ranks
        while len(self.gathers) < len(self.sent):
            index = len(self.gathers)
            pieces, futures = self.sent[index]
            if not block and not all(future.done() and future.exception() is None for future in futures):
                return
            bucket, stage = self.buckets[index], self.stages[index]
            ranks.land(pieces, futures)
            stage.up()  # the answers to the device, in one copy, before the all-gather reads them
            self.fill(bucket)
            self.gathers.append(bucket.group.all_gather_async(bucket.buffer, bucket.chunk if bucket.in_place
                                                              else bucket.chunk.clone(), lane="answers"))

    def step(self) -> None:
        self.land_all()

    def average_gradients(self) -> None:
        raise RuntimeError(refused_average(self.loop))

    def land_all(self) -> None:
        """Every bucket's answers in place: pushed, landed and all-gathered (missing gradients pushed as zeros)."""
        loop = self.loop
        for index, keys in enumerate(self.missing):  # FSA rounds need every key: a missing gradient is zeros
            for key in sorted(keys):
                warn_no_gradient(loop, key)
                self.buckets[index].layout.pack_key(key, torch.zeros_like(loop.params[key]),
                                                    self.buckets[index].buffer)
            keys.clear()
        self._start_ready()
        started = time.monotonic()
        self._send_ready(block=True)  # each bucket's slices leave as its reduce-scatter lands
        self._land_ready(block=True)
        for bucket, gather in zip(self.buckets, self.gathers, strict=True):
            gather.wait()
            bucket.layout.unpack(bucket.buffer, self.targets(bucket))
        loop.waited(time.monotonic() - started)
        loop.pushed.clear()
        self._new_step()

    def fill(self, bucket: WholePartyModel) -> None:
        """The answers are new weights; keys nobody trains keep their values."""
        loop = self.loop
        for owned, piece in bucket.pieces:
            if owned.key not in self.trained:
                piece.copy_(loop.params[owned.key].data.reshape(-1)[owned.start:owned.stop])

    def targets(self, bucket: WholePartyModel) -> list[torch.Tensor]:
        """Where a bucket's gathered answers go: the parameters."""
        return [self.loop.params[key].data for key in bucket.layout.keys]


class CollectiveLocalStep(AveragedStep, CollectiveServerStep):
    """The global servers answer with the sum of every worker's gradients; every rank steps the wrapped
    optimizer on their mean (DDP's arithmetic, across data centers)."""

    keeps_model = True  # the servers hold gradient sums: the model and the optimizer state are the workers'

    def fill(self, bucket: WholePartyModel) -> None:
        for owned, piece in bucket.pieces:
            if owned.key not in self.trained:
                piece.zero_()

    def targets(self, bucket: WholePartyModel) -> list[torch.Tensor]:
        params = self.loop.params
        for key in bucket.layout.keys:
            if params[key].grad is None:
                params[key].grad = torch.zeros_like(params[key])
        return [params[key].grad for key in bucket.layout.keys]

    def average(self) -> None:
        self.land_all()
        loop = self.loop
        scale = 1.0 / loop.kv.num_all_workers
        for param in loop.params:
            if param.grad is not None:
                param.grad.mul_(scale)
