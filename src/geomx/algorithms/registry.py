"""Every algorithm's plug-ins by name, on both sides: how the composition roots build what a config asks for.

The server core and the worker name no algorithm; ``geomx.server.compose`` and ``geomx.worker.compose`` look
their plug-ins up here. A new algorithm is one folder under ``geomx/algorithms/`` and one line per side here:

- ``SYNC_POLICIES``: when a round of pushes is complete (``kv.create(name)`` and CONFIGURE's ``sync``);
- ``AGGREGATIONS``: what a tier does with a complete round (sum, or HFA's periodic average);
- ``EXTENSIONS``: request kinds an algorithm adds to a server (ESync's state rounds);
- ``ROUTES``: how a value travels up and down between the tiers (TSEngine, DGT);
- ``PUSH_ROUTES`` and ``STEP_ASSIGNERS``: the worker side (TSEngine's relay, ESync's step assignment);
- ``STRATEGIES``: what the PyTorch wrapper's ``step()`` does (``geomx.core.strategy``), by the plan's mode and
  the party's LAN tier (``geomx.algorithms.modes``). They are named, not imported, so that servers and
  schedulers never import torch;
- ``MESSAGE_KINDS``: the message kinds algorithms declare for themselves (each in its folder's ``kinds.py``),
  so that ``check_message_kinds`` can refuse two that share a number;
- ``check_names``: a training block's sync and server optimizer names, checked against the registries.

Usage::

    policy = sync_policy("dist_async")
    aggregation = AGGREGATIONS["hfa"].from_config(node_config, server, **options)
    route = ROUTES["tsengine"](node_config, server)
    push_route = PUSH_ROUTES["relay"](node_config, context)
    strategy = strategy_class(Strategy.HFA, Lan.SERVER)(loop)
    check_message_kinds()                    # ValueError if two algorithms' kinds share a number
    check_names(topology.training)           # ConfigError for a sync or server optimizer no registry holds
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable

from ..config import ConfigError, NodeConfig, TrainingSpec, named
from ..core.plugins import Aggregation, Extension, PluginHost, Route
from ..core.policy import SyncPolicy
from ..core.strategy import WorkerStrategy
from ..core.worker_plugins import PushRoute, StepAssigner, WorkerContext
from ..optim import OPTIMIZERS
from ..protocol.wire import PluginKind, check_plugin_kinds
from .dgt.server import dgt_from_config
from .esync.kinds import STATE
from .esync.server import state_rounds_from_config
from .esync.worker import state_round_steps_from_config
from .fsa.server import FullySynchronous
from .hfa.server import HfaAggregation
from .mixed_sync.server import Asynchronous
from .modes import Lan, Strategy
from .ssp.server import BoundedStaleness
from .tsengine.kinds import RELAY
from .tsengine.server import tsengine_from_config
from .tsengine.worker import relay_from_config

SYNC_POLICIES: dict[str, type[SyncPolicy]] = {cls.name: cls for cls in (
    FullySynchronous,
    Asynchronous,
    BoundedStaleness,
)}
# the sync policies that declare themselves synchronous: what HFA, ESync and the topology's rules ask for
SYNCHRONOUS: list[str] = sorted(name for name, cls in SYNC_POLICIES.items() if cls.synchronous)

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


# The PyTorch wrapper's strategy per (plan mode, party's LAN tier), as "module:class" (imported when chosen).
STRATEGIES: dict[tuple[Strategy, Lan], str] = {
    (Strategy.SERVER, Lan.SERVER): "geomx.algorithms.fsa.strategy:ServerOptimizerStep",
    (Strategy.LOCAL, Lan.SERVER): "geomx.algorithms.fsa.strategy:LocalOptimizerStep",
    (Strategy.HFA, Lan.SERVER): "geomx.algorithms.hfa.strategy:PeriodicAverage",
    (Strategy.ESYNC, Lan.SERVER): "geomx.algorithms.esync.strategy:ESync",
    # a lan: collective party's ranks (geomx.collective): the same algorithms over torch.distributed collectives
    (Strategy.SERVER, Lan.COLLECTIVE): "geomx.algorithms.fsa.collective:CollectiveServerStep",
    (Strategy.LOCAL, Lan.COLLECTIVE): "geomx.algorithms.fsa.collective:CollectiveLocalStep",
    (Strategy.HFA, Lan.COLLECTIVE): "geomx.algorithms.hfa.collective:CollectivePeriodicAverage",
    (Strategy.ESYNC, Lan.COLLECTIVE): "geomx.algorithms.esync.collective:CollectiveESync",
    # ... whose script sharded the model with FSDP2 (fully_shard): FSA (MixedSync, SSP, DCASGD) from the shards;
    # HFA and ESync average the ranks' shards with the same strategies as a whole model
    (Strategy.SERVER, Lan.SHARDED): "geomx.algorithms.fsa.sharded:ShardedServerStep",
    (Strategy.LOCAL, Lan.SHARDED): "geomx.algorithms.fsa.sharded:ShardedLocalStep",
    (Strategy.HFA, Lan.SHARDED): "geomx.algorithms.hfa.collective:CollectivePeriodicAverage",
    (Strategy.ESYNC, Lan.SHARDED): "geomx.algorithms.esync.collective:CollectiveESync",
}


def strategy_class(mode: Strategy, lan: Lan) -> type[WorkerStrategy]:
    """The wrapper's strategy for a plan mode in a party of LAN tier ``lan`` (imported now: it needs torch);
    ValueError names a pair the table lacks."""
    try:
        module, _, name = STRATEGIES[mode, lan].partition(":")
    except KeyError:
        raise ValueError(f"no wrapper strategy for {mode} in a {lan} party") from None
    cls: type[WorkerStrategy] = getattr(importlib.import_module(module), name)
    return cls


def check_names(spec: TrainingSpec) -> None:
    """Refuse a training block naming a sync or server optimizer no registry holds, listing the valid names.

    The config layer takes any name (it imports no plug-in); the registries know which exist, so the names are
    checked here, where they are reachable: at `geomx launch` (``geomx.server.compose.check_plugins``) and when
    the torch wrapper makes its plan.
    Usage: ``check_names(topology.training)``.
    """
    if spec.sync not in SYNC_POLICIES:
        raise ConfigError(f"{named(spec, 'sync', 'training')} is unknown; valid: {sorted(SYNC_POLICIES)}")
    if spec.server_optimizer in ("auto", "none", "translate"):
        return
    choices = ["auto", "none", "translate", *sorted(OPTIMIZERS)]
    if spec.server_optimizer not in choices:
        raise ConfigError(f"{named(spec, 'server_optimizer', 'training')} is unknown; valid: {choices}")
