"""HFA / DiLoCo in a ``lan: collective`` party: inner steps data-parallel inside the party (gradients all-reduced
every step, as DDP), and every ``K1 * K2`` steps a global round in which each rank sends the weighted delta of the
slices it owns and brings back their new global model, then one all-gather.

With a model sharded by FSDP2 the same strategy runs over the shards (``kv.ranks.model_bucket`` gives it a
``ShardedBucket`` instead of a ``ModelBucket``): FSDP2 already averaged the gradients, each rank's job model is
its shards, and a global round moves the owned slices from the shards to their owners and the answers back (an
all-to-all each way) instead of an all-gather: nobody holds the whole model.

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

import torch

from ...collective.bucket import PartyModel
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
        self.bucket: PartyModel | None = None
        self.job_model: list[torch.Tensor] = []
        self.global_slices: list[torch.Tensor] = []  # each owned slice's global model, as ``bucket.pieces``
        self.local_steps = 0
        self.local_rounds = 0

    def init_keys(self) -> None:
        loop = self.loop
        kv = loop.kv
        self.bucket = bucket = kv.ranks.model_bucket(loop.params)
        views = bucket.views(loop.params)
        # the job's model: the global model of the last global round, as this rank holds the model (all of it, or
        # its FSDP2 shards); and the global model of the slices it owns, which their deltas start from
        self.job_model = [view.clone() for view in views]
        bucket.own(views)
        self.global_slices = [piece.clone() for _, piece in bucket.pieces]
        if self.rules.needs_fragments:  # every rank and party splits all the slices alike
            self.rules.assign_fragments(kv.ranks.slice_sizes())
        for (owned, _), model in zip(bucket.pieces, self.global_slices, strict=True):
            self.rules.set_global_model(owned.id, model.numpy())  # a view: updated in place after each round

    def step(self) -> None:
        loop = self.loop
        assert self.bucket is not None, "init_keys runs first"
        self.bucket.average_gradients(loop.params)
        loop.optimizer.step()
        self.local_steps += 1
        if self.local_steps % self.k1 == 0:
            self.sync()

    def sync(self) -> None:
        """A local round: the owned slices due for a global round send their deltas; if any slice of the party
        went global, every rank takes the owners' new global values."""
        loop = self.loop
        bucket = self.bucket
        assert bucket is not None
        views = bucket.views(loop.params)
        bucket.own(views)
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
        for (owned, piece), model in zip(bucket.pieces, self.global_slices, strict=True):
            if owned.id in due_ids:
                model.copy_(piece)
        bucket.spread(views)  # not due: the party's own model, as own() took it
        for share in bucket.layout.owned:  # the job's model: every slice that went global, where this rank holds it
            for owned in share:
                if self.rules.goes_global(owned.id, self.local_rounds):
                    low, high = bucket.held(owned.key)
                    start, stop = max(low, owned.start) - low, min(high, owned.stop) - low
                    if start < stop:
                        self.job_model[owned.key][start:stop].copy_(views[owned.key][start:stop])

    def load_job_model(self, into: Sequence[torch.Tensor]) -> None:
        """The global model of the last global round, as every rank of the party holds it (no traffic)."""
        assert self.bucket is not None, "init_keys runs first"
        for out, model in zip(self.bucket.views(into), self.job_model, strict=True):
            out.copy_(model)
