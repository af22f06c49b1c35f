"""Every algorithm's plug-ins by name, on both sides: how the composition roots build what a config asks for.

The server core and the worker name no algorithm; ``geomx.server.compose`` and ``geomx.worker.compose`` look
their plug-ins up here. A new algorithm is one folder under ``geomx/algorithms/`` and one line per side here:

- ``SYNC_POLICIES``: when a round of pushes is complete (``kv.create(name)`` and CONFIGURE's ``sync``);
- ``AGGREGATIONS``: what a tier does with a complete round (sum, or HFA's periodic average);
- ``EXTENSIONS``: request kinds an algorithm adds to a server (ESync's state rounds);
- ``ROUTES``: how a value travels up and down between the tiers (TSEngine, DGT);
- ``PUSH_ROUTES`` and ``STEP_ASSIGNERS``: the worker side (TSEngine's relay, ESync's step assignment);
- ``STRATEGIES``: what the PyTorch wrapper's ``step()`` does (``geomx.core.strategy``), by the plan's mode.
  They are named, not imported, so that servers and schedulers never import torch;
- ``MESSAGE_KINDS``: the message kinds algorithms declare for themselves (each in its folder's ``kinds.py``),
  so that ``check_message_kinds`` can refuse two that share a number.

Usage::

    policy = sync_policy("dist_async")
    aggregation = AGGREGATIONS["hfa"].from_config(node_config, server, **options)
    route = ROUTES["tsengine"](node_config, server)
    push_route = PUSH_ROUTES["relay"](node_config, context)
    strategy = strategy_class("HFA")(loop)
    check_message_kinds()                    # ValueError if two algorithms' kinds share a number
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable

from ..config import NodeConfig
from ..core.plugins import Aggregation, Extension, PluginHost, Route
from ..core.policy import SyncPolicy
from ..core.strategy import WorkerStrategy
from ..core.worker_plugins import PushRoute, StepAssigner, WorkerContext
from ..protocol.wire import PluginKind, check_plugin_kinds
from .dgt.server import dgt_from_config
from .esync.kinds import STATE
from .esync.server import state_rounds_from_config
from .esync.worker import state_round_steps_from_config
from .fsa.server import FullySynchronous
from .hfa.server import HfaAggregation
from .mixed_sync.server import Asynchronous
from .ssp.server import BoundedStaleness
from .tsengine.kinds import RELAY
from .tsengine.server import tsengine_from_config
from .tsengine.worker import relay_from_config

SYNC_POLICIES: dict[str, type[SyncPolicy]] = {cls.name: cls for cls in (
    FullySynchronous,
    Asynchronous,
    BoundedStaleness,
)}

AGGREGATIONS: dict[str, type[Aggregation]] = {
    "sum": Aggregation,
    "hfa": HfaAggregation,
}

EXTENSIONS: dict[str, Callable[[NodeConfig, PluginHost], Extension]] = {
    "state_rounds": state_rounds_from_config,
}

RouteFactory = Callable[[NodeConfig, PluginHost], Route]

ROUTES: dict[str, RouteFactory] = {
    "direct": lambda config, host: Route(),
    "tsengine": tsengine_from_config,
    "dgt": dgt_from_config,
}

PUSH_ROUTES: dict[str, Callable[[NodeConfig, WorkerContext], PushRoute]] = {
    "direct": lambda config, context: PushRoute(context),
    "relay": relay_from_config,
}

STEP_ASSIGNERS: dict[str, Callable[[NodeConfig, WorkerContext], StepAssigner]] = {
    "state_round": state_round_steps_from_config,
}


# Every message kind an algorithm declares (``geomx.protocol.wire.PluginKind``, in its folder's ``kinds.py``).
# The wire tells kinds apart by number only: two algorithms sharing one would take each other's messages.
MESSAGE_KINDS: tuple[PluginKind, ...] = (
    STATE,  # ESync's speed reports and step assignments
    RELAY,  # TSEngine's relays
)


def check_message_kinds(kinds: Iterable[PluginKind] = MESSAGE_KINDS) -> None:
    """ValueError naming both when two declared kinds share a number (``geomx launch`` and every server check
    it at start, through ``geomx.server.compose.check_plugins``; a unit test too)."""
    check_plugin_kinds(kinds)


def sync_policy(kind: str) -> SyncPolicy:
    """The policy for a kvstore type string; ValueError lists the valid ones."""
    try:
        return SYNC_POLICIES[kind]()
    except KeyError:
        raise ValueError(f"unknown kvstore type {kind!r}; valid: {sorted(SYNC_POLICIES)}") from None


# The PyTorch wrapper's strategy per plan mode (``geomx.torch.plan.Strategy``'s names), as "module:class".
STRATEGIES: dict[str, str] = {
    "SERVER": "geomx.algorithms.fsa.strategy:ServerOptimizerStep",
    "LOCAL": "geomx.algorithms.fsa.strategy:LocalOptimizerStep",
    "HFA": "geomx.algorithms.hfa.strategy:PeriodicAverage",
    "ESYNC": "geomx.algorithms.esync.strategy:ESync",
    # a lan: collective party's ranks (geomx.collective): the same algorithms over torch.distributed collectives
    "COLLECTIVE_SERVER": "geomx.algorithms.fsa.collective:CollectiveServerStep",
    "COLLECTIVE_LOCAL": "geomx.algorithms.fsa.collective:CollectiveLocalStep",
    # ... whose script sharded the model with FSDP2 (fully_shard): FSA (MixedSync, SSP, DCASGD) from the shards
    "SHARDED_SERVER": "geomx.algorithms.fsa.sharded:ShardedServerStep",
    "SHARDED_LOCAL": "geomx.algorithms.fsa.sharded:ShardedLocalStep",
    "COLLECTIVE_HFA": "geomx.algorithms.hfa.collective:CollectivePeriodicAverage",
    "COLLECTIVE_ESYNC": "geomx.algorithms.esync.collective:CollectiveESync",
}


def strategy_class(mode: str) -> type[WorkerStrategy]:
    """The wrapper's strategy for a plan mode (imported now: it needs torch); ValueError lists the valid ones."""
    try:
        module, _, name = STRATEGIES[mode].partition(":")
    except KeyError:
        raise ValueError(f"unknown wrapper strategy {mode!r}; valid: {sorted(STRATEGIES)}") from None
    cls: type[WorkerStrategy] = getattr(importlib.import_module(module), name)
    return cls
