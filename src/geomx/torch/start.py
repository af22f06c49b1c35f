"""A script's first geomx calls, where a configuration that cannot start is met: one line, not a traceback.

A worker reads the job's configuration (the topology, GEOMX_* and torchrun's variables) in the user's own process,
at its first geomx call: ``gx.shard``, ``gx.worker_place``, ``gx.DistributedOptimizer`` ... A ``ConfigError`` from
there (a party the topology lacks, more torchrun ranks than the party's workers, a codec that does not combine with
the optimizer) would end the script with a traceback through the wrapper, once per rank, and under torchrun its
elastic agent's dump after it. ``refuses_config`` turns it into ``SystemExit("geomx: <message>")``: the message on
stderr, exit code 1, as ``geomx.kv.create`` says a refused join. Code that wants the exception calls the functions
below these entry points (``geomx.config.node_config``, ``geomx.torch.plan.make_plan``).

``init_process_group``: torch's, for a script with its own DDP or FSDP2, after checking that the party's ranks are
a torch.distributed group (``lan: collective``). In a ``lan: server`` party nothing sets torchrun's variables (the
local server averages the gradients), and torch's own refusal (``environment variable RANK expected, but not
set``) says nothing of the reason.

Usage::

    gx.init_process_group("gloo")          # in place of torch.distributed.init_process_group("gloo")
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

import torch.distributed as dist

from ..config import ConfigError, NodeConfig, node_config

P = ParamSpec("P")
R = TypeVar("R")


def refuses_config(func: Callable[P, R]) -> Callable[P, R]:
    """``func`` with its ConfigError said in one line (``SystemExit("geomx: ...")``, exit code 1): for the wrapper's
    public entry points, which a script calls with no handler of its own."""

    @functools.wraps(func)
    def checked(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        except ConfigError as exc:
            raise SystemExit(f"geomx: {exc}") from None

    return checked


def collective_refusal(config: NodeConfig) -> str | None:
    """Why this worker's script may not make its own torch.distributed group (its party is ``lan: server``), or
    None where it may (``lan: collective``: the party's ranks are that group)."""
    if config.topology.is_collective(config.party):
        return None
    every = not any(config.topology.is_collective(p.name) for p in config.topology.parties)
    whose, where = (("this topology's parties are", "links: {lan: collective}") if every else
                    (f"party {config.party} is", f"parties.{config.party}.lan: collective"))
    return (f"{whose} lan: server (a local server averages a party's gradients, and nothing sets torchrun's RANK): "
            f"a script that calls init_process_group (its own DDP or FSDP2) needs lan: collective: set {where} in "
            "the topology (or GEOMX_LAN=collective), or drop DDP from the script (examples/cnn_torch.py)")


@refuses_config
def init_process_group(backend: str | None = None, **kwargs: Any) -> None:
    """``torch.distributed.init_process_group(backend, **kwargs)`` for a rank of a ``lan: collective`` party; in a
    ``lan: server`` party one line saying so (exit 1) instead of torch's missing ``RANK``.
    Usage: ``gx.init_process_group("gloo")`` (``"nccl"`` or ``"cpu:gloo,cuda:nccl"`` on GPUs)"""
    refusal = collective_refusal(node_config())
    if refusal is not None:
        raise ConfigError(refusal)
    dist.init_process_group(backend, **kwargs)
