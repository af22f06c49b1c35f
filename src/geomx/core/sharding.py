"""How a tensor is cut into slices and which global server (shard) holds each slice.

Every slice is an independent (key, index) on the servers: slices pipeline through the tiers and spread
over several global servers (MultiGPS). The placement rule:

* a **large** tensor (more than ``slice_elems`` elements) is cut into nearly equal slices, as many as
  needed to stay under ``slice_elems`` and rounded up to a multiple of the number of global servers, and
  slice ``i`` goes to shard ``i % G``: every global server holds the same number of its bytes;
* a **small** tensor stays whole and goes to the shard holding the fewest bytes so far (ties: the lowest
  shard id), which balances the bytes of many small tensors;
* with ``spread`` R > 1 (a job with collective parties of up to R ranks, each rank sending the slices it owns), a
  tensor of at least R x ``SPREAD_MIN_ELEMS`` elements is cut into at least R slices, so one dominant tensor is
  not one rank's WAN stream alone.

The placement depends on the order in which keys are declared, so the worker that decides it (the client
calling ``init``) sends the **explicit shard id** with every slice's INIT; the local server remembers it
and forwards there, and a global server refuses a slice meant for another shard. (GeoMX instead derives
shard ids from two independent rank orders that can disagree.)

Usage::

    planner = ShardPlanner(num_servers=2, slice_elems=1 << 20)
    slices = planner.place(numel=3_000_000, itemsize=4)  # 4 slices of 750000, shards 0, 1, 0, 1
    small = planner.place(numel=10, itemsize=4)          # one slice on the lighter shard
    ShardPlanner(1, 1 << 18, spread=4).place(65_536, 4)  # 4 slices of 16384: one per rank of a party of 4
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass


@dataclass(frozen=True)
class SliceSpan:
    """Slice ``[start, stop)`` of a flattened tensor, held by global server ``shard``."""

    start: int
    stop: int
    shard: int

    @property
    def numel(self) -> int:
        return self.stop - self.start


def slice_plan(numel: int, slice_elems: int) -> list[tuple[int, int]]:
    """[start, stop) ranges of at most ``slice_elems`` covering ``numel`` elements; one empty range if empty."""
    if numel <= 0:
        return [(0, 0)]
    return [(start, min(start + slice_elems, numel)) for start in range(0, numel, slice_elems)]


def even_split(numel: int, num_slices: int) -> list[tuple[int, int]]:
    """``num_slices`` contiguous [start, stop) ranges whose sizes differ by at most one element."""
    if num_slices < 1:
        raise ValueError(f"num_slices must be at least 1, got {num_slices}")
    bounds = [i * numel // num_slices for i in range(num_slices + 1)]
    return list(itertools.pairwise(bounds))


SPREAD_MIN_ELEMS = 1 << 13  # a slice cut for spread holds at least this many elements (32 KB of float32)


class ShardPlanner:
    """Places tensors on ``num_servers`` global servers, balancing bytes. Deterministic: every client that
    declares the same tensors in the same order computes the same plan."""

    def __init__(self, num_servers: int, slice_elems: int, spread: int = 1) -> None:
        if num_servers < 1:
            raise ValueError(f"num_servers must be at least 1, got {num_servers}")
        if slice_elems < 1:
            raise ValueError(f"slice_elems must be positive, got {slice_elems}")
        if spread < 1:
            raise ValueError(f"spread must be at least 1, got {spread}")
        self.num_servers = num_servers
        self.slice_elems = slice_elems
        self.spread = spread  # the most ranks of a collective party: a large tensor gets at least as many slices
        self.loads = [0] * num_servers  # bytes placed on each shard so far

    def place(self, numel: int, itemsize: int) -> tuple[SliceSpan, ...]:
        """The slices of a tensor of ``numel`` elements of ``itemsize`` bytes, and their shards."""
        if numel < 0 or itemsize < 1:
            raise ValueError(f"cannot place a tensor of {numel} elements of {itemsize} bytes")
        spread = self.spread if numel >= self.spread * SPREAD_MIN_ELEMS else 1
        if numel <= self.slice_elems and spread == 1:
            shard = min(range(self.num_servers), key=lambda s: (self.loads[s], s))
            self.loads[shard] += numel * itemsize
            return (SliceSpan(0, numel, shard),)
        count = max(-(-numel // self.slice_elems), spread)
        count = -(-count // self.num_servers) * self.num_servers
        slices = tuple(SliceSpan(start, stop, i % self.num_servers)
                       for i, (start, stop) in enumerate(even_split(numel, count)))
        for span in slices:
            self.loads[span.shard] += span.numel * itemsize
        return slices
