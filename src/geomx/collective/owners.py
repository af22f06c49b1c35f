"""Which rank of a collective party owns each slice: the rank that holds the party's sum of it, sends it over the
WAN on its own connection and brings its answer back for the others.

Every rank of a ``lan: collective`` party holds the whole model, but each slice crosses the WAN from one rank
only, so a party of N ranks has N WAN streams, each carrying about 1/N of the bytes. The plan is greedy by bytes
in the order the slices are declared (each to the rank holding the fewest bytes so far, ties to the lowest rank):
deterministic, so every rank computes the same plan without talking, and within one slice of perfect balance.

Usage::

    owners = SliceOwners(world_size=2)
    owners.add(key=0, slices=[(0, 1000), (1000, 2000)], itemsize=4)    # slice 0 -> rank 0, slice 1 -> rank 1
    owners.owner(0, 1)                                                  # 1
    owners.owned(1)                                                     # [OwnedSlice(key=0, index=1, ...)]
"""

from __future__ import annotations

from collections.abc import Sequence
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

    def add(self, key: int, slices: Sequence[tuple[int, int]], itemsize: int) -> list[int]:
        """Declare ``key``'s slices (``[start, stop)`` each, in order); returns the owner of each."""
        if any(sid[0] == key for sid in self._owner):
            raise ValueError(f"key {key} is already declared")
        owners = []
        for index, (start, stop) in enumerate(slices):
            rank = min(range(self.world_size), key=lambda r: (self.loads[r], r))
            self.loads[rank] += (stop - start) * itemsize
            self._owner[(key, index)] = rank
            self._owned[rank].append(OwnedSlice(key, index, len(slices), start, stop))
            owners.append(rank)
        return owners

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
