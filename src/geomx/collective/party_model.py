"""A collective rank's view of the model: the owner-ordered buffer of ``geomx.collective.layout``, this rank's
chunk of it, and the slices it owns with their views, allocated once.

``PartyModel`` is what a strategy asks of it, whether every rank holds the whole model (``WholePartyModel``: DDP's
form) or its FSDP2 shard (``geomx.collective.sharded.ShardedPartyModel``): the tensors this rank holds (``views``),
its owned slices gathered into ``chunk`` from them (``own``), and the owners' chunks written back into them
(``spread``).

Usage (inside a collective strategy)::

    bucket = WholePartyModel(layout, group, like=params[0])
    bucket.layout.pack_key(key, grad, bucket.buffer)       # each gradient as backward makes it, then
    bucket.group.reduce_scatter_async(bucket.chunk, bucket.buffer).wait()   # chunk: this rank's slices' sums
    for owned, piece in bucket.pieces: ...                 # send piece, write the answer into it
    bucket.spread([p.data for p in params])                # every rank: every owner's answers (all-gather)
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Protocol

import torch

from .group import PartyGroup
from .layout import OwnerLayout
from .owners import OwnedSlice

SPREAD_WINDOW = 1 << 23  # elements per rank in one of a spread's all-gathers (32 MB of fp32)


class PartyModel(Protocol):
    """A party's model as one rank holds it, and the moves between it and the slices this rank owns.

    Usage: ``views = model.views(params); model.own(views); ...the pieces travel...; model.spread(views)``
    """

    layout: OwnerLayout
    group: PartyGroup
    whole: bool  # every rank holds the whole model (else its FSDP2 shards)
    chunk: torch.Tensor  # this rank's owned slices, back to back (``layout``'s chunk)
    pieces: list[tuple[OwnedSlice, torch.Tensor]]  # each owned slice with its view into ``chunk``

    def views(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """What this rank holds of each of ``tensors`` (the model's, or a copy's), flat; writes reach them."""
        ...

    def held(self, key: int) -> tuple[int, int]:
        """The flat range ``[start, stop)`` of ``key`` that ``views`` holds."""
        ...

    def average_gradients(self, params: Sequence[torch.Tensor]) -> None:
        """Every ``param.grad`` = the party's mean gradient (of what this rank holds)."""
        ...

    def own(self, views: Sequence[torch.Tensor], only: Callable[[OwnedSlice], bool] | None = None) -> None:
        """``chunk`` = this rank's owned slices of the party's model (``views``: every rank's, alike); ``only``: at
        least the slices it accepts (a form may copy more)."""
        ...

    def spread(self, views: Sequence[torch.Tensor], only: Callable[[OwnedSlice], bool] | None = None) -> None:
        """Every rank's ``views`` = the owners' chunks (what they hold of them); ``only``: at least the slices it
        accepts (a form may move more)."""
        ...

    def share(self, tensors: Sequence[torch.Tensor], only: Callable[[OwnedSlice], bool] | None = None,
              group: PartyGroup | None = None) -> None:
        """Every rank's ``tensors`` = each slice as its owner's ``tensors`` hold it (``only``: at least those);
        ``group``: the party's group to move them over (a ``sibling`` off the rank's own thread)."""
        ...


class WholePartyModel:
    """One flat buffer for the whole model and this rank's chunk, on the model's device: the ``PartyModel`` of a
    party whose ranks each hold the whole model.

    Each is allocated when first used, so a bucket holds only what its user needs: a gradient all-reduce
    (``OverlappedMean``) never makes the chunk, HFA's spreads never make the whole buffer (they gather in windows
    of a scratch of their own). ``in_place``: the chunk is this rank's own part of the buffer (a view), so a
    reduce-scatter leaves the sums where the all-gather sends them from: no chunk of its own, no copy into the
    buffer before the all-gather (FSA's per-step path, on a group whose collectives go rank to rank)."""

    whole = True

    def __init__(self, layout: OwnerLayout, group: PartyGroup, like: torch.Tensor, in_place: bool = False) -> None:
        self.layout = layout
        self.group = group
        self.in_place = in_place
        self._dtype, self._device = like.dtype, like.device
        self._offset = {owned.id: offset for owned, offset in zip(layout.owned[group.rank], layout.offsets[group.rank],
                                                                   strict=True)}

    @functools.cached_property
    def buffer(self) -> torch.Tensor:
        """The whole model, owner by owner (the padding zero)."""
        return self.layout.empty(self._dtype, self._device)

    @functools.cached_property
    def chunk(self) -> torch.Tensor:
        """This rank's owned slices, back to back (``in_place``: its part of ``buffer``)."""
        if self.in_place:
            return self.layout.chunk(self.buffer, self.group.rank)
        return torch.zeros(self.layout.chunk_numel, dtype=self._dtype, device=self._device)

    @functools.cached_property
    def pieces(self) -> list[tuple[OwnedSlice, torch.Tensor]]:
        """Each owned slice with its view into ``chunk``."""
        return list(self.layout.pieces(self.chunk, self.group.rank))

    def all_reduce(self, tensors: Sequence[torch.Tensor]) -> None:
        """``tensors`` = their sum over the party, in place (one all-reduce of the whole buffer)."""
        self.layout.pack(tensors, self.buffer)
        self.group.all_reduce(self.buffer)
        self.layout.unpack(self.buffer, tensors)

    def own(self, tensors: Sequence[torch.Tensor], only: Callable[[OwnedSlice], bool] | None = None) -> None:
        """``chunk`` = this rank's slices of ``tensors`` (no collective); ``only``: just the slices it accepts."""
        for owned, piece in self.pieces:
            if only is not None and not only(owned):
                continue
            piece.copy_(tensors[owned.key].detach().reshape(-1)[owned.start:owned.stop])

    def spread(self, tensors: Sequence[torch.Tensor], only: Callable[[OwnedSlice], bool] | None = None,
               group: PartyGroup | None = None) -> None:
        """Every rank's chunk into ``tensors``: each slice as its owner holds it. ``only``: just the slices it
        accepts (a streaming fragment), so a round that lands a quarter of the model moves a quarter of it; every
        rank passes the same ``only``. ``group``: the party's group to gather over (a ``sibling`` when called from
        another thread). Each rank's slices travel back to back in all-gathers of at most ``SPREAD_WINDOW``
        elements per rank (the shorter ranks padded), so the scratch that stays resident is ``world x window``,
        not the model."""
        group = group or self.group
        world = group.world_size
        chosen = [[owned for owned in self.layout.owned[rank] if only is None or only(owned)] for rank in range(world)]
        width = max(sum(owned.numel for owned in rank_slices) for rank_slices in chosen)
        flats = {key: tensor.detach().view(-1) for key, tensor in zip(self.layout.keys, tensors, strict=True)}
        with torch.no_grad():
            for begin in range(0, width, SPREAD_WINDOW):
                size = min(SPREAD_WINDOW, width - begin)
                gathered = self._scratch[:size * world]
                mine = gathered[group.rank * size:(group.rank + 1) * size]  # in place: no allocation
                for owned, low, high, at in _segments(chosen[group.rank], begin, begin + size):
                    offset = self._offset[owned.id]
                    mine[at:at + high - low].copy_(self.chunk[offset + low:offset + high])
                group.all_gather(gathered, mine)
                for rank, rank_slices in enumerate(chosen):
                    window = gathered[rank * size:(rank + 1) * size]
                    for owned, low, high, at in _segments(rank_slices, begin, begin + size):
                        flats[owned.key][owned.start + low:owned.start + high].copy_(window[at:at + high - low])

    def share(self, tensors: Sequence[torch.Tensor], only: Callable[[OwnedSlice], bool] | None = None,
              group: PartyGroup | None = None) -> None:
        """Every rank's ``tensors`` = each slice as its owner's ``tensors`` hold it (the owners wrote their slices
        there; ``only``, ``group``: as for ``spread``). On gloo each owner's ranges go straight from its tensors to
        the other ranks' (rank-to-rank messages, one per run of adjacent slices): no chunk, no scratch, no copy.
        Elsewhere: ``own`` then ``spread``."""
        group = group or self.group
        if not group.direct:
            self.own(tensors, only)
            self.spread(tensors, only, group)
            return
        flats = {key: tensor.detach().view(-1) for key, tensor in zip(self.layout.keys, tensors, strict=True)}
        sends, recvs, number = [], [], 0
        for rank in range(group.world_size):
            for key, start, stop in _runs(owned for owned in self.layout.owned[rank] if only is None or only(owned)):
                piece = flats[key][start:stop]
                if rank == group.rank:
                    sends += [(peer, number, piece) for peer in range(group.world_size) if peer != rank]
                else:
                    recvs.append((rank, number, piece))
                number += 1
        group.send_recv_async("share", number, sends, recvs).wait()

    @functools.cached_property
    def _scratch(self) -> torch.Tensor:
        """The spreads' all-gather target: the party's ranks x one window (never more than a chunk each)."""
        return torch.empty(self.layout.world_size * min(SPREAD_WINDOW, self.layout.chunk_numel), dtype=self._dtype,
                           device=self._device)

    def views(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Each whole tensor, flat (a view)."""
        return [t.detach().view(-1) for t in tensors]

    def held(self, key: int) -> tuple[int, int]:
        """All of ``key``."""
        return 0, self.layout.numels[self.layout.position[key]]

    def average_gradients(self, params: Sequence[torch.Tensor]) -> None:
        """Every rank's gradients = their mean over the party (one all-reduce; a missing gradient counts as 0)."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        self.all_reduce(grads)
        scale = 1.0 / self.group.world_size
        for param, grad in zip(params, grads, strict=True):
            if param.grad is None:
                param.grad = grad
            param.grad.mul_(scale)


def _runs(rank_slices: Iterable[OwnedSlice]) -> Iterator[tuple[int, int, int]]:
    """``(key, start, stop)`` of each run of adjacent slices in ``rank_slices`` (a rank's, in declaration order)."""
    run: list[int] | None = None
    for owned in rank_slices:
        if run is not None and run[0] == owned.key and run[2] == owned.start:
            run[2] = owned.stop
            continue
        if run is not None:
            yield run[0], run[1], run[2]
        run = [owned.key, owned.start, owned.stop]
    if run is not None:
        yield run[0], run[1], run[2]


def _segments(rank_slices: Sequence[OwnedSlice], begin: int, end: int) -> Iterator[tuple[OwnedSlice, int, int, int]]:
    """The parts of the slices in ``rank_slices``, laid back to back, that fall in ``[begin, end)``: each slice with the
    range ``[low, high)`` of its elements there and where that range starts in the window."""
    at = 0
    for owned in rank_slices:
        low, high = max(at, begin), min(at + owned.numel, end)
        if low < high:
            yield owned, low - at, high - at, low - begin
        at += owned.numel
        if at >= end:
            return


def bucket_like(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """An empty tensor of the device and dtype a bucket of ``tensors`` is kept in: theirs, or, where a model mixes
    dtypes (bfloat16 weights, float32 norms), the widest, so that no float32 parameter's sum is rounded to bfloat16.
    Usage: ``WholePartyModel(layout, group, like=bucket_like(params))``"""
    dtype = functools.reduce(torch.promote_types, (t.dtype for t in tensors))
    return tensors[0].detach().new_empty(0, dtype=dtype)


def backward_buckets(numels: dict[int, int], itemsize: int, bucket_bytes: int) -> list[list[int]]:
    """The keys, deepest first (backward produces their gradients in about that order), cut into groups of about
    ``bucket_bytes`` (a key larger than that is a group of its own), as DDP cuts its buckets, except DDP's smaller
    first bucket (1 MB: on the wan bench's MLP, 1 MB buckets throughout moved FSA's step by 1%, within its noise)."""
    groups: list[list[int]] = [[]]
    size = 0
    for key in sorted(numels, reverse=True):
        if groups[-1] and size + numels[key] * itemsize > bucket_bytes:
            groups.append([])
            size = 0
        groups[-1].append(key)
        size += numels[key] * itemsize
    return [group for group in groups if group]
