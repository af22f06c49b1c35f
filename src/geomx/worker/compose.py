"""The worker's composition root: which plug-ins a worker runs, chosen once at start from its typed config.

The one place that maps a worker's configuration to plug-in names (the server's is ``geomx.compose``).

Usage (inside ``KVStore.__init__``)::

    plugins = compose_worker(node_config, context)
    future = plugins.route.push(server, message)
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import Mode, NodeConfig
from .plugins import PushRoute, StepAssigner, WorkerContext
from .registry import PUSH_ROUTES, STEP_ASSIGNERS


@dataclass
class WorkerPlugins:
    """What one worker runs: a push route and a step assigner."""

    route: PushRoute
    steps: StepAssigner


@dataclass(frozen=True)
class WorkerChoice:
    """The plug-ins a worker runs, by registry name."""

    route: str = "direct"
    steps: str = "state_round"  # the servers always answer step-assignment rounds


def choose_worker(config: NodeConfig) -> WorkerChoice:
    """The plug-ins ``config`` asks for: the relay route under TSEngine inside a party (HiPS only)."""
    topology = config.topology
    relay = topology.intra_ts and topology.mode is Mode.HIPS
    return WorkerChoice(route="relay" if relay else "direct")


def compose_worker(config: NodeConfig, context: WorkerContext) -> WorkerPlugins:
    """Build the plug-ins ``config`` asks for, each bound to ``context``."""
    choice = choose_worker(config)
    return WorkerPlugins(route=PUSH_ROUTES[choice.route](config, context),
                         steps=STEP_ASSIGNERS[choice.steps](config, context))
