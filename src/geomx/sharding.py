"""How a tensor is cut into slices and which server holds each slice.

Large tensors travel as slices of at most ``slice_elems`` elements, each an independent (key, part)
on the servers: they pipeline through the tiers and spread over several global servers. Every process
computes the same plan from the same topology, so no negotiation is needed.

Usage::

    plan = slice_plan(numel=3_000_000, slice_elems=1 << 20)   # [(0, 1048576), (1048576, 2097152), ...]
    server = shard_for(key=3, part=1, num_servers=2)
"""

from __future__ import annotations


def slice_plan(numel: int, slice_elems: int) -> list[tuple[int, int]]:
    """[start, stop) ranges covering ``numel`` elements; one empty range for an empty tensor."""
    if numel <= 0:
        return [(0, 0)]
    return [(start, min(start + slice_elems, numel)) for start in range(0, numel, slice_elems)]


def shard_for(key: int, part: int, num_servers: int) -> int:
    """The server (shard id) that owns slice ``part`` of ``key``: consecutive slices on different servers."""
    return (key + part) % num_servers
