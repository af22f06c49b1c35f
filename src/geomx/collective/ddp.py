"""A script's own ``DistributedDataParallel`` inside a collective party: which of DDP and geomx averages the
party's gradients, and the checks that the two agree on the party.

A torchrun script wraps its model in DDP; in a ``lan: collective`` party it may keep doing so and hand the DDP
module to ``gx.DistributedOptimizer``. The wrapper then works on the module DDP wraps (its names and layers are the
model's, as in a party without DDP), and each strategy says who averages the party's gradients:

- DDP, where its all-reduce is what the strategy needs (HFA, DiLoCo, ESync: the inner steps are data-parallel):
  the strategy adds nothing per step, DDP's buckets, overlap, ``no_sync`` and comm hooks work as the user set them;
- geomx, where the strategy's per-step path replaces the all-reduce (FSA, MixedSync, SSP: each rank's slices go
  through the global servers between a reduce-scatter and an all-gather): DDP gets a comm hook that leaves its
  buckets as they are (no traffic; torch's own ``noop_hook`` does the same), so the party's gradients do not cross
  the LAN twice.

DDP's process group must be the party's (torchrun's default group: every rank of this party and no other).

Usage (inside the wrapper and its strategies)::

    module, ddp = unwrap(model)            # ddp: the script's DistributedDataParallel, or None
    check_group(ddp, group)                # refused, naming the party, if DDP spans other ranks
    keep_local(ddp, party)                 # FSA's path: DDP communicates nothing, geomx averages
"""

# no ``from __future__ import annotations``: DDP reads the comm hook's annotations and accepts only the real
# ``dist.GradBucket`` and ``Future[torch.Tensor]``, not their names
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ..config import ConfigError
from .group import PartyGroup


def unwrap(model: nn.Module) -> tuple[nn.Module, DistributedDataParallel | None]:
    """The module a script's DDP wraps (or ``model`` itself), and the DDP if there is one."""
    if isinstance(model, DistributedDataParallel):
        return model.module, model
    return model, None


def check_group(ddp: DistributedDataParallel, group: PartyGroup) -> None:
    """Refuse a DDP whose process group is not the party's: its all-reduce would mix in other ranks' gradients
    (or miss some of the party's)."""
    ranks = dist.get_world_size(ddp.process_group), dist.get_rank(ddp.process_group)
    if ranks != (group.world_size, group.rank):
        raise ConfigError(f"party {group.party}: the model's DistributedDataParallel runs over a process group of "
                          f"{ranks[0]} ranks (this one rank {ranks[1]}), but the party's group has "
                          f"{group.world_size} (this one rank {group.rank}): build DDP over the party's own group "
                          "(torchrun's default one)")


def gradients_stay_local(_state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP's comm hook while geomx averages the party's gradients itself: each bucket as backward made it, no
    traffic (as torch's ``debugging_hooks.noop_hook``)."""
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


def hook_name(ddp: DistributedDataParallel) -> str | None:
    """The name of the comm hook registered on ``ddp`` (its function's, as DDP's logging records it), or None where
    DDP says none: a refusal names the script's hook, where torch's own error says only that one is there."""
    try:
        name = ddp._get_ddp_logging_data().get("comm_hook")
    except (AttributeError, RuntimeError):  # a private call: a torch without it leaves torch's own error to say it
        return None
    return str(name) if name else None


def keep_local(ddp: DistributedDataParallel, party: str) -> None:
    """DDP communicates nothing from now on: the strategy's own path averages the party's gradients. Refused,
    naming it, where the script (or DDP's ``mixed_precision``) registered a comm hook already: that hook would
    be replaced, and what it did with the gradients lost."""
    try:
        ddp.register_comm_hook(None, gradients_stay_local)
    except RuntimeError as error:
        raise ConfigError(f"party {party}: the model's DistributedDataParallel has a comm hook already "
                          f"({hook_name(ddp) or error}); "
                          "under FSA, MixedSync and SSP geomx averages the party's gradients itself and needs "
                          "DDP's: drop the hook (or DDP's mixed_precision), or run HFA / DiLoCo, where DDP's own "
                          "all-reduce, hook included, is the inner step") from None
