"""FSA in a ``lan: collective`` party: the party's gradients meet in one reduce-scatter, each rank syncs the slices
it owns with the global servers over its own connection, one all-gather brings every owner's answers home.

Per step, as data: every rank's gradients -> (LAN, torch.distributed) reduce-scatter: rank r holds the party's
sum of the slices it owns -> (WAN) one push per owned slice to the global server holding it, which sums over
parties (one contributor per party per slice, as a local server would be) -> the answer (new weights, or the
global sum of gradients when the optimizer runs on the workers) into the same buffer -> (LAN) all-gather ->
every rank's parameters (or gradients, then the wrapped optimizer steps on their mean).

Usage (chosen by the wrapper for a collective party's plan)::

    strategy = CollectiveServerStep(loop)      # or CollectiveLocalStep: the optimizer on every rank
    strategy.step()                            # after backward
"""

from __future__ import annotations

import time

import torch

from ...collective.bucket import ModelBucket
from ...core.strategy import Loop, WorkerStrategy


class CollectiveServerStep(WorkerStrategy):
    """The global servers run the optimizer and answer with new weights."""

    answers_weights = True

    def __init__(self, loop: Loop) -> None:
        super().__init__(loop)
        self.bucket: ModelBucket | None = None

    def init_keys(self) -> None:
        loop = self.loop
        self.bucket = ModelBucket(loop.kv.ranks.layout(), loop.kv.ranks.group, like=loop.params[0].data)
        self.trained = set(loop.trained)

    def step(self) -> None:
        loop = self.loop
        bucket = self.bucket
        assert bucket is not None, "init_keys runs first"
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in loop.params]
        bucket.reduce_scatter(grads)
        sent = [(owned, piece) for owned, piece in bucket.pieces if owned.key in self.trained]
        started = time.monotonic()
        loop.kv.ranks.exchange(sent, loop.priority)
        loop.waited(time.monotonic() - started)
        self.land(bucket)

    def land(self, bucket: ModelBucket) -> None:
        """The answers in this rank's chunk are new weights: every rank gets every owner's."""
        loop = self.loop
        for owned, piece in bucket.pieces:  # keys nobody trains keep their values
            if owned.key not in self.trained:
                piece.copy_(loop.params[owned.key].data.reshape(-1)[owned.start:owned.stop])
        bucket.all_gather_into([p.data for p in loop.params])


class CollectiveLocalStep(CollectiveServerStep):
    """The global servers answer with the sum of every worker's gradients; every rank steps the wrapped
    optimizer on their mean (DDP's arithmetic, across data centers)."""

    answers_weights = False

    def land(self, bucket: ModelBucket) -> None:
        loop = self.loop
        for owned, piece in bucket.pieces:
            if owned.key not in self.trained:
                piece.zero_()
        for param in loop.params:
            if param.grad is None:
                param.grad = torch.zeros_like(param)
        bucket.all_gather_into([p.grad for p in loop.params])
        scale = 1.0 / loop.kv.num_all_workers
        for param in loop.params:
            param.grad.mul_(scale)
        loop.optimizer.step()
