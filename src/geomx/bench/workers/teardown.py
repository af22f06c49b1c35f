"""The end of a bench worker that ran torch DDP: every rank meets once more, then the process leaves at once.

Why not ``dist.destroy_process_group()`` and a normal exit: with torch 2.13 on gloo, the DDP model's reducer,
freed when ``main`` returns, can hold the process group's last reference; the group's destructor then joins gloo's
worker thread while holding the GIL that thread needs to free its last work, and the rank hangs for ever (seen: a
``geomx bench --only lan`` DDP row, rank 0 stuck in ``~ProcessGroupGloo`` after its figures were written). Leaving
with ``os._exit`` skips that teardown; whatever the worker writes must be written and closed before.

Usage (the last line of a DDP worker's ``main``)::

    leave_process_group()              # or leave_process_group(device) on CUDA
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn

import torch
import torch.distributed as dist


def leave_process_group(device: torch.device | None = None) -> NoReturn:
    """A barrier of every rank (none leaves while another still sends), then exit 0 without tearing down."""
    if dist.is_initialized():
        if device is not None and device.type == "cuda":
            dist.barrier(device_ids=[device.index])
        else:
            dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
