"""A server process keeps the memory it frees, in one heap for all its threads.

A server's rounds allocate arrays of their slices' sizes again and again: each push's decode, the sum, the
optimizer's new weights and scratch, the answer's encoding. glibc gives each thread its own arena, which keeps
its free memory apart from the others' (the I/O thread's received frames, the dispatch thread's arrays), serves
a block above its mmap threshold (at most 32 MB) with fresh pages from the kernel, which fault in and are
zeroed, and returns a free top of a heap to the kernel on its own rules.

``keep_freed_memory`` tells glibc (``mallopt``) to serve every thread from one arena, never to mmap a block, and
never to trim: freed memory is reused by the next allocation that fits. Measured on the 85M job's global server
(``python -m geomx.bench.scale --configs streaming_int8 --rates 1Gbit --h 100 --rounds 3``, four runs before,
sixteen since): its peak resident memory went from 3.16-3.24x the model to 2.40-2.54x, its system time from 2.8-3.2
s to 2.3-2.7 s; the time it saves is the first outer round's, which faulted in fresh pages (1 MB slices reuse freed
memory from the second round on either way). Slices above 32 MB fault in every round without it: one round of a
10.7M-element slice (two int8 pushes decoded and summed, outer Nesterov, the answer encoded) took 150 ms with it off
and 119 ms on. Elsewhere than glibc it does nothing. Call it before the process starts its threads (a thread takes
its arena at its first allocation); ``python -m geomx.node`` does for every server.

Usage::

    keep_freed_memory()     # True where glibc took all three settings
"""

from __future__ import annotations

import ctypes

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_MAX = -4
M_ARENA_MAX = -8
NEVER_TRIM = 2**31 - 1  # (mallopt takes an int) a free top of the heap up to 2 GB is never returned to the kernel


def keep_freed_memory() -> bool:
    """One arena, no mmap for large blocks, no trimming: freed memory is reused, not faulted in again. Returns
    whether the C library took all three (False where it has no ``mallopt``: not glibc)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    settings = ((M_ARENA_MAX, 1), (M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, NEVER_TRIM))
    return all(mallopt(parameter, value) == 1 for parameter, value in settings)
