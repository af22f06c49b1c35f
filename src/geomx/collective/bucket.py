"""A collective rank's view of the model: the owner-ordered buffer of ``geomx.collective.layout``, this rank's
chunk of it, and the slices it owns with their views, allocated once.

Usage (inside a collective strategy)::

    bucket = ModelBucket(layout, group, like=params[0])
    bucket.layout.pack_key(key, grad, bucket.buffer)       # each gradient as backward makes it, then
    bucket.group.reduce_scatter_async(bucket.chunk, bucket.buffer).wait()   # chunk: this rank's slices' sums
    for owned, piece in bucket.pieces: ...                 # send piece, write the answer into it
    bucket.all_gather_into([p.data for p in params])       # every rank: every owner's answers
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .group import PartyGroup
from .layout import OwnerLayout
from .owners import OwnedSlice


class ModelBucket:
    """One flat buffer for the whole model and this rank's chunk, on the model's device."""

    def __init__(self, layout: OwnerLayout, group: PartyGroup, like: torch.Tensor) -> None:
        self.layout = layout
        self.group = group
        self.buffer = layout.empty(like.dtype, like.device)
        self.chunk = torch.zeros(layout.chunk_numel, dtype=like.dtype, device=like.device)
        self.pieces: list[tuple[OwnedSlice, torch.Tensor]] = list(layout.pieces(self.chunk, group.rank))

    def all_reduce(self, tensors: Sequence[torch.Tensor]) -> None:
        """``tensors`` = their sum over the party, in place (one all-reduce of the whole buffer)."""
        self.layout.pack(tensors, self.buffer)
        self.group.all_reduce(self.buffer)
        self.layout.unpack(self.buffer, tensors)

    def own(self, tensors: Sequence[torch.Tensor]) -> None:
        """``chunk`` = this rank's slices of ``tensors`` (no collective)."""
        for owned, piece in self.pieces:
            piece.copy_(tensors[owned.key].detach().reshape(-1)[owned.start:owned.stop])

    def all_gather_into(self, tensors: Sequence[torch.Tensor]) -> None:
        """Every rank's chunk into ``tensors``: each slice as its owner holds it."""
        self.group.all_gather(self.buffer, self.chunk)
        self.layout.unpack(self.buffer, tensors)


def backward_buckets(numels: dict[int, int], itemsize: int, bucket_bytes: int) -> list[list[int]]:
    """The keys, deepest first (backward produces their gradients in about that order), cut into groups of about
    ``bucket_bytes`` (a key larger than that is a group of its own), as DDP cuts its buckets."""
    groups: list[list[int]] = [[]]
    size = 0
    for key in sorted(numels, reverse=True):
        if groups[-1] and size + numels[key] * itemsize > bucket_bytes:
            groups.append([])
            size = 0
        groups[-1].append(key)
        size += numels[key] * itemsize
    return [group for group in groups if group]
