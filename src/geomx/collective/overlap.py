"""The party's mean gradient, all-reduced bucket by bucket while backward still runs (DDP's overlap), for the
strategies whose ranks each hold the whole model and step on the party's mean (collective HFA's inner steps).

Buckets are ``backward_buckets``' (keys deepest first, about ``bucket_bytes`` each); a bucket's all-reduce starts
as soon as its last gradient is in and every bucket before it has started, so the collectives come in one order on
every rank. ``finish`` packs zeros for a parameter without a gradient (it counts as 0, as in ``WholePartyModel``),
waits, and writes the mean into every ``param.grad``. A second gradient for a key before ``finish`` (gradient
accumulation over several backwards) abandons the overlap for that step: ``finish`` all-reduces what ``.grad``
holds then.

Usage (from the strategy's gradient hook and its step)::

    mean = OverlappedMean(group, params, layout_of=ranks.layout, bucket_bytes=25 << 20)
    mean.on_gradient(key, grad)      # backward's hook, each gradient as it is made
    mean.finish()                    # after backward: every param.grad = the party's mean
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from .group import PartyGroup, Pending
from .layout import OwnerLayout
from .party_model import WholePartyModel, backward_buckets, bucket_like


class OverlappedMean:
    """Gradient buckets in flight over the party's group, and the parameters they average."""

    def __init__(self, group: PartyGroup, params: Sequence[torch.Tensor],
                 layout_of: Callable[[list[int]], OwnerLayout], bucket_bytes: int,
                 trained: Sequence[int] | None = None) -> None:
        """``layout_of``: a flat layout of some keys, alike on every rank (``PartyRanks.layout``); ``trained``: the
        keys whose gradients backward makes (default: all; the others stay zeros in the buffers)."""
        self.params = list(params)
        self.trained = set(range(len(self.params)) if trained is None else trained)
        numels = {key: p.numel() for key, p in enumerate(self.params)}
        like = bucket_like(self.params)
        self.group = group
        self.buckets = [WholePartyModel(layout_of(keys), group, like=like)
                        for keys in backward_buckets(numels, like.element_size(), bucket_bytes)]
        self.bucket_of = {key: index for index, bucket in enumerate(self.buckets) for key in bucket.layout.keys}
        self.missing: list[set[int]] = []
        self.started: list[Pending] = []
        self.accumulating = False
        self._new_step()

    def _new_step(self) -> None:
        self.missing = [{key for key in bucket.layout.keys if key in self.trained} for bucket in self.buckets]
        self.started = []
        self.accumulating = False

    def on_gradient(self, key: int, grad: torch.Tensor) -> None:
        """Copy ``grad`` into its bucket; start every bucket that is complete, in order."""
        index = self.bucket_of[key]
        if key not in self.missing[index]:
            self.accumulating = True  # a second backward before the step: finish averages .grad instead
        if self.accumulating:
            return
        bucket = self.buckets[index]
        bucket.layout.pack_key(key, grad, bucket.buffer)
        self.missing[index].discard(key)
        self._start_ready()

    def _start_ready(self) -> None:
        while len(self.started) < len(self.buckets) and not self.missing[len(self.started)]:
            bucket = self.buckets[len(self.started)]
            self.started.append(bucket.group.all_reduce_async(bucket.buffer))

    def finish(self) -> None:
        """Every ``param.grad`` = the party's mean gradient (a missing one counts as 0)."""
        if not self.accumulating:
            for index, keys in enumerate(self.missing):
                for key in sorted(keys):
                    self.buckets[index].layout.pack_key(key, torch.zeros_like(self.params[key]),
                                                        self.buckets[index].buffer)
                keys.clear()
            self._start_ready()
        for pending in self.started:
            pending.wait()  # raises, naming the party, if a rank failed
        scale = 1.0 / self.group.world_size
        for bucket in self.buckets:
            params = [self.params[key] for key in bucket.layout.keys]
            if self.accumulating:  # the overlap was abandoned: one all-reduce of what .grad holds now
                bucket.average_gradients(params)
                continue
            for param in params:
                if param.grad is None:
                    param.grad = torch.zeros_like(param)
            bucket.layout.unpack(bucket.buffer, [param.grad for param in params])
            for param in params:
                param.grad.mul_(scale)
        self._new_step()
