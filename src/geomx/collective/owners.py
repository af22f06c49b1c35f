"""Which rank of a collective party owns each slice: the rank that holds the party's sum of it, sends it over the
WAN on its own connection and brings its answer back for the others.

Every rank of a ``lan: collective`` party holds the whole model, but each slice crosses the WAN from one rank
only, so a party of N ranks has N WAN streams, each carrying about 1/N of the bytes. The plan is greedy by bytes
(each slice to the rank holding the fewest bytes so far, ties to the lowest rank), the largest slices first among
the keys declared together: deterministic, so every rank computes the same plan without talking, and within one
slice of perfect balance. A key that never travels per step (the wrapper's model signature) gets owners but no
weight. Under FSDP2 a ``prefer`` rule places each slice that lies inside one rank's local shard on that rank first
(its values are already there: nothing moves to reach its owner); the slices across a shard boundary then even
out the loads.

Usage::

    owners = SliceOwners(world_size=2)
    owners.add(key=0, slices=[(0, 1000), (1000, 2000)], itemsize=4)    # slice 0 -> rank 0, slice 1 -> rank 1
    owners.owner(0, 1)                                                  # 1
    owners.owned(1)                                                     # [OwnedSlice(key=0, index=1, ...)]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..protocol.wire import SliceId


@dataclass(frozen=True)
class OwnedSlice:
    """A slice as its owner sees it: ``[start, stop)`` of key ``key``'s flattened tensor, the slice ``index`` of
    ``num_slices``."""

    key: int
    index: int
    num_slices: int
    start: int
    stop: int

    @property
    def numel(self) -> int:
        return self.stop - self.start

    @property
    def id(self) -> SliceId:
        return (self.key, self.index)


class SliceOwners:
    """The owner rank of every declared slice of one party of ``world_size`` ranks."""

    def __init__(self, world_size: int) -> None:
        if world_size < 1:
            raise ValueError(f"a party has at least one rank, got world_size={world_size}")
        self.world_size = world_size
        self.loads = [0] * world_size  # bytes owned by each rank so far
        self._owner: dict[SliceId, int] = {}
        self._owned: list[list[OwnedSlice]] = [[] for _ in range(world_size)]
        self._keys: dict[int, int] = {}  # key -> its declaration order

    def add(self, key: int, slices: Sequence[tuple[int, int]], itemsize: int) -> list[int]:
        """Declare ``key``'s slices (``[start, stop)`` each, in order); returns the owner of each."""
        self.add_many([(key, slices, itemsize)])
        return [self._owner[(key, index)] for index in range(len(slices))]

    def add_many(self, keys: Sequence[tuple[int, Sequence[tuple[int, int]], int]],
                 prefer: Callable[[int, int, int], int | None] | None = None) -> None:
        """Declare keys together, ``(key, slices, itemsize)`` each (itemsize 0: a key that never travels per
        step): their slices are placed largest first, so the ranks' loads come out even. ``prefer(key, start, stop)``,
        if given, names the rank a slice should go to (None: no preference); those slices are placed first."""
        entries = []
        for key, slices, itemsize in keys:
            if key in self._keys:
                raise ValueError(f"key {key} is already declared")
            self._keys[key] = len(self._keys)
            entries += [((stop - start) * itemsize, key, index, len(slices), start, stop)
                        for index, (start, stop) in enumerate(slices)]
        wished = {(e[1], e[2]): prefer(e[1], e[4], e[5]) for e in entries} if prefer is not None else {}
        placed_first = sorted(entries, key=lambda e: (wished.get((e[1], e[2])) is None, -e[0], self._keys[e[1]], e[2]))
        for nbytes, key, index, count, start, stop in placed_first:
            rank = wished.get((key, index))
            if rank is None:
                rank = min(range(self.world_size), key=lambda r: (self.loads[r], r))
            elif not 0 <= rank < self.world_size:
                raise ValueError(f"key {key} slice {index} preferred rank {rank}, not in a party of {self.world_size}")
            self.loads[rank] += nbytes
            self._owner[(key, index)] = rank
            self._owned[rank].append(OwnedSlice(key, index, count, start, stop))
        for rank_slices in self._owned:  # a rank's slices in declaration order: the order of its chunk in a layout
            rank_slices.sort(key=lambda s: (self._keys[s.key], s.index))

    def owner(self, key: int, index: int) -> int:
        """The rank owning slice ``index`` of ``key``."""
        try:
            return self._owner[(key, index)]
        except KeyError:
            raise KeyError(f"key {key} slice {index} was never declared") from None

    def owned(self, rank: int) -> list[OwnedSlice]:
        """The slices ``rank`` owns, in declaration order."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is not in a party of {self.world_size}")
        return list(self._owned[rank])

    def imbalance(self) -> float:
        """The most bytes any rank owns over the mean (1.0: perfectly even)."""
        total = sum(self.loads)
        return max(self.loads) * self.world_size / total if total else 1.0
