"""HFA / DiLoCo in a ``lan: collective`` party: inner steps data-parallel inside the party (gradients all-reduced
every step, as DDP), and every ``K1 * K2`` steps a global round in which each rank sends the weighted delta of the
slices it owns and brings back their new global model, then one all-gather.

With a model sharded by FSDP2 the same strategy runs over the shards (``loop.ranks.party_model`` gives it a
``ShardedPartyModel`` instead of a ``WholePartyModel``): FSDP2 already averaged the gradients, each rank's job model is
its shards, and a global round moves the owned slices from the shards to their owners and the answers back (an
all-to-all each way) instead of an all-gather: nobody holds the whole model. Under the script's own DDP the inner
steps are DDP's (its all-reduce, its buckets and hooks): the strategy only steps and runs the global rounds.

The party's ranks hold one model (DDP keeps them equal), so the local average of HiPS HFA has nothing to average:
a collective party counts K1 steps per local round without a LAN round, and every K2-th local round goes global
(with ``fragments``, each fragment on its own round, as ``LocalFrequencyAggregation`` decides). What a rank sends
for a slice is what a local server would send, ``(model - global model) * n_p / N``, and the global servers (their
outer optimizer included) do not know the difference.

Overlapped (``fragment_delay`` tau, Streaming DiLoCo): a fragment's deltas leave from buffers of their own and
every rank trains on; tau local rounds later the owners land the answers, one spread brings every rank the
fragment's new global model (the job's model), and each rank mixes it with its own,
``(1 - fragment_alpha) * global + fragment_alpha * own``, as a local server answers its workers (without an
overlap, the round's own answer is mixed so, as torchft's ``fragment_update_alpha`` at delay 0). Whole-model
ranks on the CPU over gloo do all of a fragment's round trip on its thread, from a buffer the size of one fragment
(``trips.FragmentTrips``), and their blocking global rounds go out a few windows of the owned slices at a time
(``windows.WindowedRounds``); elsewhere (CUDA, FSDP2) both go through the owned chunk.

Usage (chosen by the wrapper for a collective party under HFA)::

    strategy = CollectivePeriodicAverage(loop)
    strategy.step()                              # after backward: all-reduce, a local step, a sync when due
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext

import torch

from ...collective.bucket import PartyModel, WholePartyModel
from ...collective.host import HostChunk
from ...collective.overlap import OverlappedMean
from ...collective.owners import OwnedSlice
from ...core.strategy import AveragedStep, Loop
from ...protocol.tensors import wire_dtype
from .rules import LocalFrequencyAggregation, streaming_options
from .strategy import global_round_steps
from .trips import FragmentTrips
from .windows import WindowedRounds


class CollectivePeriodicAverage(AveragedStep):
    """Inner steps on the party's mean gradient; the owned slices' global rounds when due."""

    def __init__(self, loop: Loop) -> None:
        super().__init__(loop)
        hfa = loop.kv.hfa
        # read and checked as a local server's plug-in reads them (a bad one refused here with the same words)
        streaming = streaming_options(dict(loop.kv.config.topology.training.plugin_options), hfa.k2)
        self.k1 = hfa.k1
        self.rules = LocalFrequencyAggregation(k2=hfa.k2, party_weight=loop.kv.num_workers / loop.kv.num_all_workers,
                                               fragments=streaming.fragments)
        self.bucket: PartyModel | None = None
        self.mean: OverlappedMean | None = None  # whole-model ranks: gradients all-reduced as backward makes them
        self.stage: HostChunk | None = None  # the owned chunk on the host, where the rules' numpy arithmetic reads it
        self.job_model: list[torch.Tensor] = []
        self.global_slices: list[torch.Tensor] = []  # each owned slice's global model, as ``bucket.pieces``
        self.local_steps = 0
        self.local_rounds = 0
        self.delay = streaming.delay  # local rounds a fragment's global round overlaps
        self.alpha = streaming.alpha  # the party's model's share in the mix (at delay 0 too, as torchft's)
        # overlapped global rounds: the local round that lands them -> the pieces sent and their round trip (sent,
        # answered and decoded into the pieces on the ``trips`` thread)
        self.in_flight: dict[int, tuple[list[tuple[OwnedSlice, torch.Tensor]], Future[None]]] = {}
        self.trips: ThreadPoolExecutor | None = None
        # whole-model ranks on the CPU (gloo), streaming and overlapped: each fragment from a buffer of its own,
        # landed into the job's model and shared on the round trip's thread; no chunk (see ``trips``)
        self.fragment_trips: FragmentTrips | None = None
        # the same ranks, blocking: a global round a few windows of the owned slices at a time (see ``windows``)
        self.windows: WindowedRounds | None = None
        self.piece_of: dict[tuple[int, int], int] = {}  # an owned slice's index in the bucket's pieces

    def init_keys(self) -> None:
        loop = self.loop
        kv = loop.kv
        self.bucket = bucket = loop.ranks.party_model(loop.params)
        # under FSDP2 the shards' gradients come averaged already, and so do they under the script's own DDP
        if isinstance(bucket, WholePartyModel) and loop.ddp is None:
            self.mean = OverlappedMean(loop.ranks.group, loop.params, loop.ranks.layout,  # DDP's buckets of bucket_mb
                                       kv.config.topology.training.bucket_bytes, trained=loop.trained)
            self.pushes_gradients = True  # read by the wrapper after init_keys: backward's hooks call on_gradient
        views = bucket.views(loop.params)
        # the job's model: the global model of the last global round, as this rank holds the model (all of it, or
        # its FSDP2 shards); and the global model of the slices it owns, which their deltas start from
        # its copy in the dtype the servers hold (float32 for a bfloat16 model: DiLoCo's outer model in float32)
        self.job_model = [view.to(wire_dtype(view.dtype), copy=True) for view in views]
        if self.rules.needs_fragments:  # every rank and party splits all the slices alike
            self.rules.assign_fragments(loop.ranks.slice_sizes())
        if isinstance(bucket, WholePartyModel) and loop.params[0].device.type == "cpu" and loop.ranks.group.direct:
            if not self.delay:
                self.windows = WindowedRounds(self.rules, loop.ranks, bucket, self.job_model)
                return
            if self.rules.fragments > 1:
                self.fragment_trips = FragmentTrips(self.rules, loop.ranks, bucket, self.job_model, self.delay,
                                                    loop.ranks.group.sibling(kv.config.topology.timeouts.round_s))
                return
        bucket.own(views)
        # on the host, where the rules' numpy arithmetic reads them (the model itself may be on a GPU)
        self.stage = HostChunk(bucket.chunk, bucket.pieces)
        self.stage.down()
        if isinstance(bucket, WholePartyModel) and not self.stage.copies:  # whole tensors on the CPU: the owned slices'
            # global models are the job model's own ranges (they hold the same values), not a copy of them
            self.global_slices = [self.job_model[owned.key][owned.start:owned.stop] for owned, _ in bucket.pieces]
        else:
            self.global_slices = [piece.clone() for _, piece in self.stage.pieces]
        self.piece_of = {owned.id: index for index, (owned, _) in enumerate(bucket.pieces)}
        for (owned, _), model in zip(bucket.pieces, self.global_slices, strict=True):
            self.rules.set_global_model(owned.id, model.numpy())  # a view: updated in place after each round

    def steps_of(self, rounds: int) -> int | None:
        return global_round_steps(self.loop, self.k1, rounds)

    def on_gradient(self, key: int, grad: torch.Tensor) -> None:
        assert self.mean is not None, "only whole-model ranks hook the gradients"
        self.mean.on_gradient(key, grad)

    def inner_step(self) -> None:
        """The party's mean gradient (unless ``average_gradients`` made it this step), then the optimizer."""
        self.take_average()
        self.loop.update()

    def average(self) -> None:
        """The party's mean gradient in every ``.grad``: DDP's all-reduce of the buckets backward filled, FSDP2's
        own under a sharded model; the script's own DDP made it already."""
        assert self.bucket is not None, "init_keys runs first"
        if self.mean is not None:
            self.mean.finish()
        elif self.loop.ddp is None:
            self.bucket.average_gradients(self.loop.params)

    def step(self) -> None:
        if self.fragment_trips is not None:  # the leaving fragment's copy, made while the step computed
            self.fragment_trips.copied()
        self.inner_step()
        self.local_steps += 1
        if self.local_steps % self.k1 == 0:
            self.sync()

    def sync(self) -> None:
        """A local round: the owned slices due for a global round send their deltas (and, without overlap, wait
        for the answers); the slices whose global round lands now take the new global model, mixed with the
        party's own under overlap. Whether any slice lands is the same answer on every rank (the rules know every
        rank's slices), so every rank joins the same share or spread."""
        bucket = self.bucket
        assert bucket is not None
        views = bucket.views(self.loop.params)
        self.local_rounds += 1
        count = self.local_rounds
        trips = self.fragment_trips
        if trips is not None:  # the fragment landing now (its trip did the rest) is mixed, then the leaving one leaves
            started = time.monotonic()
            trips.land(count)
            self.loop.waited(time.monotonic() - started)
            # the leaving fragment's copy starts after the mix, so the two do not share the cores; where a slice that
            # lands now leaves again (delay a multiple of K2), before it: what leaves is the round's model, not the mix
            before = trips.lands_and_leaves(count)
            if before:
                trips.leave(views, count, self.loop.priority)
            self._mix(views, count)
            if not before:
                trips.leave(views, count, self.loop.priority)
            return
        if self.windows is not None:
            started = time.monotonic()
            landed = self.windows.run(views, count, self.loop.priority)
            self.loop.waited(time.monotonic() - started)
            if not landed:
                return
        elif not self._round(views, count):
            return
        self._mix(views, count)

    def _mix(self, views: list[torch.Tensor], count: int) -> None:
        """The party's model takes every slice that landed at local round ``count``: the new global model, mixed
        with the party's own under overlap."""
        bucket = self.bucket
        assert bucket is not None
        mine = self.alpha  # with or without an overlap, as a local server mixes (torchft's fragment_update_alpha)
        for share in bucket.layout.owned:  # the party's model: every slice that landed, mixed under overlap
            for owned in share:
                if self._lands(owned.id, count):
                    low, high = bucket.held(owned.key)
                    start, stop = max(low, owned.start) - low, min(high, owned.stop) - low
                    if start >= stop:
                        continue
                    model, new = views[owned.key][start:stop], self.job_model[owned.key][start:stop]
                    if mine and model.dtype != new.dtype:  # a bfloat16 model: mixed in float32, then rounded
                        model.copy_(torch.lerp(model.to(new.dtype), new, 1.0 - mine))
                    elif mine:
                        model.lerp_(new, 1.0 - mine)  # mine * model + (1 - mine) * new, in one pass
                    else:
                        model.copy_(new)

    def _round(self, views: list[torch.Tensor], count: int) -> bool:
        """Local round ``count`` through the owned chunk: the deltas due from it (sent, and waited for unless
        overlapped), the answers landing now into the job's model; whether any slice lands."""
        loop = self.loop
        bucket, stage = self.bucket, self.stage
        assert bucket is not None and stage is not None
        streaming = self.rules.fragments > 1  # a fragment at a time: copy and spread only its slices
        leaving = (lambda owned: self.rules.goes_global(owned.id, count)) if streaming else None
        # the delta replaces the piece (no allocation), unless overlapped rounds read the chunk before they land
        # (the host stage copies it whole, or the spread moves every piece): then it leaves from its own array
        in_place = not self.delay
        # whole tensors on the CPU: each delta is computed from the model's own range into its piece, in one pass
        fused = (in_place and not stage.copies and isinstance(bucket, WholePartyModel)  # a bfloat16 model's through
                 and all(v.dtype == m.dtype for v, m in zip(views, self.job_model, strict=True)))  # the float32 chunk
        if not fused:
            bucket.own(views, only=leaving)
            stage.down()  # the owned slices to the host, in one copy (none on the CPU)
        due = []
        for owned, piece in stage.pieces:
            if leaving is not None and not leaving(owned):
                self.rules.after_local_round(owned.id, None)  # counts the round; nothing leaves
                continue
            model = views[owned.key][owned.start:owned.stop] if fused else piece
            delta = self.rules.after_local_round(owned.id, model.numpy(), out=piece.numpy() if in_place else None)
            if delta is not None:
                due.append((owned, piece if in_place else torch.from_numpy(delta)))
        started = time.monotonic()
        if due and not self.delay:  # each piece: the slice's new global model (a residual codec's change of it, added)
            loop.ranks.exchange(due, loop.priority, kind="delta", bases=self._bases(due))
        elif due:  # encoded, sent and its answers decoded on a thread of its own, while the rank trains on
            self.in_flight[count + self.delay] = (due, self._round_trips().submit(self._round_trip, due))
        landing = due if not self.delay else self._land(count)
        loop.waited(time.monotonic() - started)
        if not any(self._lands(owned.id, count) for share in bucket.layout.owned for owned in share):
            return False
        for owned, answer in landing:  # each owned slice's global model
            self.global_slices[self.piece_of[owned.id]].copy_(answer)
        # a fragment's slices only where the bucket moves just those (FSDP2's all-to-all moves every piece)
        whole = isinstance(bucket, WholePartyModel)
        lands = (lambda owned: self._lands(owned.id, count)) if streaming and whole else None
        if whole and not stage.copies:  # each owner's answers are its job model's ranges:
            bucket.share(self.job_model, only=lands)  # from there to the other ranks' (over gloo, rank to rank)
            return True
        for (owned, piece), model in zip(stage.pieces, self.global_slices, strict=True):
            if lands is None or lands(owned):
                piece.copy_(model)
        stage.up()  # the owned slices' global models to the device, in one copy
        # the job's model, where this rank holds it: the slices that landed (a fragment's, under streaming)
        bucket.spread(self.job_model, only=lands)
        return True

    def _lands(self, slice_id: tuple[int, int], count: int) -> bool:
        """Whether local round ``count`` brings ``slice_id`` its new global model (``delay`` rounds after it left)."""
        sent = count - self.delay
        return sent >= 1 and self.rules.goes_global(slice_id, sent)

    def _land(self, count: int) -> list[tuple[OwnedSlice, torch.Tensor]]:
        """The answers of the overlapped rounds due at local round ``count`` (waiting for any not in yet)."""
        flight = self.in_flight.pop(count, None)
        if flight is None:
            return []
        pieces, trip = flight
        trip.result()  # raises what the round trip raised (a timeout naming the slice, say)
        return pieces

    def _round_trip(self, due: list[tuple[OwnedSlice, torch.Tensor]]) -> None:
        """An overlapped round on the ``trips`` thread: the deltas out, the slices' new global models back into
        ``due``."""
        ranks = self.loop.ranks
        ranks.land(due, ranks.send(due, self.loop.priority, kind="delta"), self._bases(due))

    def _round_trips(self) -> ThreadPoolExecutor:
        """The thread of the overlapped rounds: one at a time, in the order they left (a codec's residuals too)."""
        if self.trips is None:
            self.trips = ThreadPoolExecutor(max_workers=1, thread_name_prefix="geomx-fragments")
        return self.trips

    def finish(self) -> None:
        """Rounds still overlapping when the loop ends complete on their thread (not into the model) before the
        worker leaves, so none is cut off mid-message."""
        if self.fragment_trips is not None:
            self.fragment_trips.finish()
        if self.trips is not None:
            for _, trip in self.in_flight.values():
                trip.exception()  # waits; a failure here only means the round's answer is not needed
            self.trips.shutdown(wait=True)
            self.trips = None

    def _bases(self, pieces: Sequence[tuple[OwnedSlice, torch.Tensor]]) -> list[torch.Tensor]:
        """Each piece's slice's last global model (a residual codec's answers are changes of it)."""
        return [self.global_slices[self.piece_of[owned.id]] for owned, _ in pieces]

    def load_job_model(self, into: Sequence[torch.Tensor]) -> None:
        """The global model of the last global round, as every rank of the party holds it (no traffic)."""
        assert self.bucket is not None, "init_keys runs first"
        trips = self.fragment_trips  # a trip may be writing the job model on its thread: read it between writes
        with trips.reading() if trips is not None else nullcontext(self.job_model) as job_model:
            for out, model in zip(self.bucket.views(into), job_model, strict=True):
                out.copy_(model)
