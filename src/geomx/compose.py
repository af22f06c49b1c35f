"""The composition root: which plug-ins a server runs, chosen once at start from its typed config.

The server core names no algorithm. This module is the one place that maps a node's configuration to plug-in
names, and builds each through its registry (``geomx.sync``, ``geomx.routes``, ``geomx.aggregation``).

Usage (inside ``ParameterServer.__init__``)::

    plugins = compose(node_config, server)
    server.route, server.aggregation = plugins.route, plugins.aggregation
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .aggregation.registry import AGGREGATIONS, EXTENSIONS
from .config import ConfigError, NodeConfig, TrainingSpec
from .core.plugins import Aggregation, Completion, Extension, Handler, Route, ServerHost
from .core.policy import SyncPolicy
from .optim import OPTIMIZERS
from .routes.registry import ROUTES
from .sync.registry import SYNC_POLICIES, sync_policy
from .wire import Kind

# Until the master's CONFIGURE names another, rounds of pushes wait for every client (and a local tier's
# always do): the policy a server starts with.
DEFAULT_SYNC = "dist_sync"


@dataclass
class Plugins:
    """What one server runs: a sync policy, a route, an aggregation and extensions."""

    policy: SyncPolicy
    route: Route
    aggregation: Aggregation
    extensions: list[Extension] = field(default_factory=list)

    def requests(self) -> dict[Kind, Handler]:
        """The extensions' request kinds and their handlers."""
        return {kind: handler for extension in self.extensions for kind, handler in extension.requests().items()}

    def completions(self) -> dict[Kind, Completion]:
        """What a completed round of each extension kind does."""
        return {kind: done for extension in self.extensions for kind, done in extension.completions().items()}


@dataclass(frozen=True)
class Choice:
    """The plug-ins a server runs, by registry name."""

    sync: str = DEFAULT_SYNC
    route: str = "direct"
    aggregation: str = "sum"
    # any worker may send ESync's speed reports (ESync is a worker-side switch): always served
    extensions: tuple[str, ...] = ("state_rounds",)


def choose(config: NodeConfig) -> Choice:
    """The plug-ins ``config`` asks for."""
    topology = config.topology
    return Choice(route="tsengine" if topology.tsengine is not None else "direct",
                  aggregation="hfa" if topology.hfa is not None else "sum")


def compose(config: NodeConfig, host: ServerHost) -> Plugins:
    """Build the plug-ins ``config`` asks for, each bound to ``host``."""
    choice = choose(config)
    return Plugins(policy=sync_policy(choice.sync),
                   route=ROUTES[choice.route](config, host),
                   aggregation=AGGREGATIONS[choice.aggregation](config, host),
                   extensions=[EXTENSIONS[name](config, host) for name in choice.extensions])


def configured_policy(name: str) -> SyncPolicy:
    """The policy the master names later (CONFIGURE's ``sync``), from the same registry; ValueError lists the
    valid names."""
    return sync_policy(name)


def check_names(spec: TrainingSpec) -> None:
    """Refuse a training block naming a sync or server optimizer no registry holds, listing the valid names.

    The config layer takes any name (it imports no plug-in); the registries know which exist, so the names are
    checked here, where they are reachable: at `geomx launch` and when the torch wrapper makes its plan.
    Usage: ``check_names(topology.training)``.
    """
    if spec.sync not in SYNC_POLICIES:
        raise ConfigError(f"training.sync {spec.sync!r} is unknown; valid: {sorted(SYNC_POLICIES)}")
    choices = ["auto", "none", *sorted(OPTIMIZERS)]
    if spec.server_optimizer not in choices:
        raise ConfigError(f"training.server_optimizer {spec.server_optimizer!r} is unknown; valid: {choices}")
