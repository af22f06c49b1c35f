"""The worker's composition root: which plug-ins a worker runs, chosen once at start from its typed config.

The one place that maps a worker's configuration to plug-in names (the server's is ``geomx.server.compose``).

Usage (inside ``KVStore.__init__``)::

    plugins = compose_worker(node_config, context)
    future = plugins.route.push(server, message)
"""

from __future__ import annotations

from dataclasses import dataclass

from ..algorithms.registry import PUSH_ROUTES, STEP_ASSIGNERS
from ..codecs import FP16, Codec
from ..config import Mode, NodeConfig
from ..core.worker_plugins import PushRoute, StepAssigner, WorkerContext


@dataclass
class WorkerPlugins:
    """What one worker runs: a push route, a step assigner, the codec of its pushes on the LAN (None: dense), and
    the factor a server optimizer scales the tier's sum by (``rescale_grad``, unless the optimizer sets one)."""

    route: PushRoute
    steps: StepAssigner
    lan_codec: Codec | None = None
    rescale_grad: float = 1.0


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
    topology = config.topology
    # the fp16 switch (``fp16: true`` / GEOMX_FP16=1): pushes travel as float16 (answers come back as float16)
    lan_codec = FP16() if topology.fp16 else None
    # FSA/MixedSync: the servers sum the workers' gradients, the optimizer wants their mean; HFA: the global
    # server already receives a weighted average delta
    rescale = 1.0 if topology.hfa is not None else 1.0 / topology.num_all_workers
    return WorkerPlugins(route=PUSH_ROUTES[choice.route](config, context),
                         steps=STEP_ASSIGNERS[choice.steps](config, context), lan_codec=lan_codec, rescale_grad=rescale)
