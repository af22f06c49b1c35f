"""Between FSDP2's shards and the slices' owners: which elements each rank sends to each other rank so that every
owner holds its slices (``to owners``), and back (``to shards``), each way in one ``all_to_all_single``.

Under FSDP2 rank ``r`` holds one flat range of every parameter (``geomx.collective.fsdp``), and the slices it
owns (``geomx.collective.owners``) need not lie in it. A ``Move`` is one intersection of a source rank's range
with a slice its target rank owns. Every rank computes every move from the shapes and the owners alone, and
orders them alike: a rank's outbox holds its moves to rank 0, then to rank 1, ..., each group in key order, then
by position; its inbox the moves from each rank, in the same order. That is exactly what ``all_to_all_single``
with these split sizes delivers, so no index travels. A move whose source is its target (a slice inside the
owner's own shard: the owners prefer those) is a local copy, outside the collective.

Usage (one rank; ``geomx.collective.sharded.ShardedPartyModel`` runs it)::

    plan = Reshard(shards, layout, rank)
    plan.pack_for_owners(views, outbox)                      # views: this rank's flat shard of each key
    dist.all_to_all_single(inbox, outbox, plan.in_splits, plan.out_splits)
    plan.land_at_owners(inbox, views, chunk)                 # chunk: this rank's owned slices, as layout packs them
    plan.pack_for_shards(chunk, inbox)                       # ... and back: the same buffers, the roles swapped
    dist.all_to_all_single(outbox, inbox, plan.out_splits, plan.in_splits)
    plan.land_in_shards(outbox, chunk, views)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from .fsdp import LocalShards
from .layout import OwnerLayout


@dataclass(frozen=True)
class Move:
    """Elements ``[start, stop)`` of key ``key``: in rank ``source``'s shard at ``local_at``, in rank ``target``'s
    chunk (its owned slices) at ``chunk_at``."""

    key: int
    start: int
    stop: int
    source: int
    target: int
    local_at: int
    chunk_at: int

    @property
    def numel(self) -> int:
        return self.stop - self.start


def moves(shards: LocalShards, layout: OwnerLayout) -> list[Move]:
    """Every move of the party, in key order (the layout's), then by position."""
    found = []
    for target, (rank_slices, offsets) in enumerate(zip(layout.owned, layout.offsets, strict=True)):
        for owned, offset in zip(rank_slices, offsets, strict=True):
            for source, (low, high) in enumerate(shards.ranges[owned.key]):
                start, stop = max(low, owned.start), min(high, owned.stop)
                if start < stop:
                    found.append(Move(owned.key, start, stop, source, target, start - low,
                                      offset + start - owned.start))
    return sorted(found, key=lambda m: (layout.position[m.key], m.start))


class Reshard:
    """Rank ``rank``'s part of the moves: what it keeps, sends and receives, and the split sizes of the
    all-to-all each way (``out_splits``: elements to each rank on the way to the owners; ``in_splits``: from
    each rank; the way back swaps them)."""

    def __init__(self, shards: LocalShards, layout: OwnerLayout, rank: int) -> None:
        if shards.world_size != layout.world_size:
            raise ValueError(f"shards of {shards.world_size} ranks, owners of {layout.world_size}")
        missing = set(layout.keys) - set(shards.ranges)
        if missing:
            raise ValueError(f"keys {sorted(missing)[:10]} have owners but no shards")
        self.rank = rank
        self.moves = moves(shards, layout)
        self.kept = [m for m in self.moves if m.source == rank == m.target]
        self.outgoing = sorted((m for m in self.moves if m.source == rank != m.target), key=lambda m: m.target)
        self.incoming = sorted((m for m in self.moves if m.target == rank != m.source), key=lambda m: m.source)
        self.out_splits = _splits(self.outgoing, layout.world_size, lambda m: m.target)
        self.in_splits = _splits(self.incoming, layout.world_size, lambda m: m.source)
        # whether any rank of the party moves anything (every rank computes the same answer)
        self.crosses = any(m.source != m.target for m in self.moves)

    def pack_for_owners(self, views: Sequence[torch.Tensor], outbox: torch.Tensor) -> None:
        """``outbox`` = this rank's outgoing elements, read from its shards ``views`` (one flat tensor per key)."""
        _copy(self.outgoing, outbox, lambda m: views[m.key][m.local_at:m.local_at + m.numel], to_box=True)

    def land_at_owners(self, inbox: torch.Tensor, views: Sequence[torch.Tensor], chunk: torch.Tensor) -> None:
        """``chunk`` = this rank's owned slices: the kept elements from ``views``, the others from ``inbox``."""
        with torch.no_grad():
            for m in self.kept:
                chunk[m.chunk_at:m.chunk_at + m.numel].copy_(views[m.key][m.local_at:m.local_at + m.numel])
        _copy(self.incoming, inbox, lambda m: chunk[m.chunk_at:m.chunk_at + m.numel], to_box=False)

    def pack_for_shards(self, chunk: torch.Tensor, outbox: torch.Tensor) -> None:
        """``outbox`` (the size of the way there's inbox) = the owned elements other ranks' shards hold."""
        _copy(self.incoming, outbox, lambda m: chunk[m.chunk_at:m.chunk_at + m.numel], to_box=True)

    def land_in_shards(self, inbox: torch.Tensor, chunk: torch.Tensor, views: Sequence[torch.Tensor]) -> None:
        """``views`` (this rank's shards) = the owners' values: the kept ones from ``chunk``, others from ``inbox``."""
        with torch.no_grad():
            for m in self.kept:
                views[m.key][m.local_at:m.local_at + m.numel].copy_(chunk[m.chunk_at:m.chunk_at + m.numel])
        _copy(self.outgoing, inbox, lambda m: views[m.key][m.local_at:m.local_at + m.numel], to_box=False)


def _splits(chosen: list[Move], world_size: int, peer: Callable[[Move], int]) -> list[int]:
    sizes = [0] * world_size
    for m in chosen:
        sizes[peer(m)] += m.numel
    return sizes


def _copy(chosen: list[Move], box: torch.Tensor, place: Callable[[Move], torch.Tensor], to_box: bool) -> None:
    """Copy each move's elements between ``box`` (back to back, in ``chosen``'s order) and ``place(move)``."""
    at = 0
    with torch.no_grad():
        for m in chosen:
            here = place(m)
            if to_box:
                box[at:at + m.numel].copy_(here)
            else:
                here.copy_(box[at:at + m.numel])
            at += m.numel
