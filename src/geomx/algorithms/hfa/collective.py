"""HFA / DiLoCo in a ``lan: collective`` party: inner steps data-parallel inside the party (gradients all-reduced
every step, as DDP), and every ``K1 * K2`` steps a global round in which each rank sends the weighted delta of the
slices it owns and brings back their new global model, then one all-gather.

The party's ranks hold one model (DDP keeps them equal), so the local average of HiPS HFA has nothing to average:
a collective party counts K1 steps per local round without a LAN round, and every K2-th local round goes global
(with ``fragments``, each fragment on its own round, as ``LocalFrequencyAggregation`` decides). What a rank sends
for a slice is what a local server would send, ``(model - global model) * n_p / N``, and the global servers (their
outer optimizer included) do not know the difference.

Usage (chosen by the wrapper for a collective party under HFA)::

    strategy = CollectivePeriodicAverage(loop)
    strategy.step()                              # after backward: all-reduce, a local step, a sync when due
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import torch

from ...collective.bucket import ModelBucket
from ...core.strategy import Loop, WorkerStrategy
from .rules import LocalFrequencyAggregation


class CollectivePeriodicAverage(WorkerStrategy):
    """Inner steps on the party's mean gradient; the owned slices' global rounds when due."""

    def __init__(self, loop: Loop) -> None:
        super().__init__(loop)
        hfa = loop.kv.hfa
        self.k1 = hfa.k1
        self.rules = LocalFrequencyAggregation(k2=hfa.k2, party_weight=loop.kv.num_workers / loop.kv.num_all_workers,
                                               fragments=int(dict(loop.kv.config.topology.training.plugin_options)
                                                             .get("fragments", "1")))
        self.bucket: ModelBucket | None = None
        self.job_model: list[torch.Tensor] = []
        self.local_steps = 0
        self.local_rounds = 0

    def init_keys(self) -> None:
        loop = self.loop
        kv = loop.kv
        self.bucket = ModelBucket(kv.ranks.layout(), kv.ranks.group, like=loop.params[0].data)
        # the job's model: the global model of the last global round (all of it, on every rank)
        self.job_model = [p.data.detach().clone() for p in loop.params]
        owned = [owned for owned, _ in self.bucket.pieces]
        if self.rules.needs_fragments:  # every rank and party splits all the slices alike
            self.rules.assign_fragments(kv.ranks.slice_sizes())
        for slice_ in owned:
            self.rules.set_global_model(slice_.id, self._global_view(slice_.key, slice_.start, slice_.stop))

    def _global_view(self, key: int, start: int, stop: int) -> np.ndarray:
        return self.job_model[key].reshape(-1)[start:stop].numpy()

    def step(self) -> None:
        loop = self.loop
        bucket = self.bucket
        assert bucket is not None, "init_keys runs first"
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in loop.params]
        bucket.all_reduce(grads)
        scale = 1.0 / loop.kv.num_workers
        for param, grad in zip(loop.params, grads, strict=True):
            if param.grad is None:
                param.grad = grad
            param.grad.mul_(scale)
        loop.optimizer.step()
        self.local_steps += 1
        if self.local_steps % self.k1 == 0:
            self.sync()

    def sync(self) -> None:
        """A local round: the owned slices due for a global round send their deltas; if any slice of the party
        went global, every rank gathers the new global values."""
        loop = self.loop
        bucket = self.bucket
        assert bucket is not None
        bucket.own([p.data for p in loop.params])
        self.local_rounds += 1
        due = []
        for owned, piece in bucket.pieces:
            delta = self.rules.after_local_round(owned.id, piece.numpy())
            if delta is not None:
                piece.copy_(torch.from_numpy(delta))
                due.append((owned, piece))
        if not any(self.rules.goes_global(owned.id, self.local_rounds)  # the same answer on every rank: no
                   for share in bucket.layout.owned for owned in share):     # collective needed to agree on it
            return
        started = time.monotonic()
        loop.kv.ranks.exchange(due, loop.priority, kind="delta")  # each piece: the slice's new global model
        loop.waited(time.monotonic() - started)
        due_ids = {owned.id for owned, _ in due}
        for owned, piece in bucket.pieces:  # not due: the party's own model, unchanged
            if owned.id not in due_ids:
                piece.copy_(loop.params[owned.key].data.reshape(-1)[owned.start:owned.stop])
        bucket.all_gather_into([p.data for p in loop.params])
        for rank_share in bucket.layout.owned:  # the job's model: every slice that went global, on every rank
            for owned in rank_share:
                if self.rules.goes_global(owned.id, self.local_rounds):
                    source = loop.params[owned.key].data.reshape(-1)[owned.start:owned.stop]
                    self.job_model[owned.key].reshape(-1)[owned.start:owned.stop].copy_(source)

    def load_job_model(self, into: Sequence[torch.Tensor]) -> None:
        """The global model of the last global round, as every rank of the party holds it (no traffic)."""
        for out, model in zip(into, self.job_model, strict=True):
            out.copy_(model)
