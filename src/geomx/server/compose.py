"""The composition root: which plug-ins a server runs, chosen once at start from its typed config.

The server core names no algorithm. This module is the one place that maps a node's configuration to plug-in
names, and builds each through its registry (``geomx.algorithms``, ``geomx.algorithms``, ``geomx.algorithms``).

Usage (inside ``ParameterServer.__init__``)::

    plugins = compose(node_config, server)
    server.route, server.aggregation = plugins.route, plugins.aggregation
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..algorithms.registry import (
    AGGREGATIONS,
    EXTENSIONS,
    ROUTES,
    SYNC_POLICIES,
    SYNCHRONOUS,
    check_message_kinds,
    check_names,
)
from ..codecs import FP16, CodecError, make_codec
from ..config import ConfigError, NodeConfig, Topology, TrainingSpec, named
from ..config.combinations import configure_facts
from ..config.combinations import refusal as combination_refusal
from ..config.fields import closest
from ..core.encoding import Encoding
from ..core.options import OptionError, parse_options, undeclared
from ..core.plugins import Aggregation, Completion, Extension, Handler, PluginHost, Route, RouteChain
from ..core.policy import SyncPolicy
from ..optim import OPTIMIZERS, optimizer_from_spec
from ..protocol.wire import Kind, MessageKind

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
    encoding: Encoding = field(default_factory=Encoding)

    def requests(self) -> dict[MessageKind, Handler]:
        """The extensions' request kinds and their handlers."""
        return {kind: handler for extension in self.extensions for kind, handler in extension.requests().items()}

    def completions(self) -> dict[MessageKind, Completion]:
        """What a completed round of each extension kind does."""
        return {kind: done for extension in self.extensions for kind, done in extension.completions().items()}


@dataclass(frozen=True)
class Choice:
    """The plug-ins a server runs, by registry name."""

    sync: str = DEFAULT_SYNC
    route: str = "direct"
    uplinks: tuple[str, ...] = ()  # further routes, chained after ``route`` (DGT's UDP uplink)
    aggregation: str = "sum"
    # any worker may send ESync's speed reports (ESync is a worker-side switch): always served
    extensions: tuple[str, ...] = ("state_rounds",)


def choose(config: NodeConfig) -> Choice:
    """The plug-ins ``config`` asks for."""
    topology = config.topology
    return Choice(route="tsengine" if topology.tsengine is not None else "direct",
                  uplinks=("dgt",) if topology.dgt is not None else (),
                  aggregation=_aggregation_name(topology))


def check_plugins(training: TrainingSpec, topology: Topology | None = None) -> None:
    """ConfigError unless ``training.sync`` names a sync policy, ``training.compression`` a codec, no two
    algorithms' message kinds share a number, and every plug-in option is one a plug-in of this job takes, with a
    value it can read (``geomx launch`` calls this before starting any process; every server and worker at start).
    ``topology``: the job's, when known (HFA's aggregation options are taken only with HFA).

    Every sync policy may take options (the master may name any of them later, as ``kv.create`` does).
    """
    check_names(training)
    if training.compression is not None:  # a codec no registry holds, or a parameter it lacks: named now
        try:
            make_codec(training.compression)
        except CodecError as exc:
            raise ConfigError(f"{named(training, 'compression', 'training')}: {exc}") from None
    if training.server_optimizer in OPTIMIZERS:  # a named one: a parameter it lacks is named now, not by each worker
        try:
            optimizer_from_spec({"name": training.server_optimizer, "params": dict(training.server_optimizer_params)})
        except ValueError as exc:
            raise ConfigError(f"{named(training, 'server_optimizer', 'training')}: {exc}") from None
    try:
        check_message_kinds()
    except ValueError as exc:
        raise ConfigError(f"the algorithms' message kinds: {exc}") from None
    options = dict(training.plugin_options)
    aggregation = _aggregation_name(topology)
    takers = {**{name: cls.options for name, cls in SYNC_POLICIES.items()},
              f"the {aggregation} aggregation": AGGREGATIONS[aggregation].options}
    refusal = undeclared(options, takers)
    if refusal is not None:
        unknown = sorted(set(options) - _declared(takers))
        given = [text for text in (named(training, key, "training") for key in unknown) if "=" in text]
        hints = _unknown_hints(unknown, aggregation)
        raise ConfigError(f"{', '.join(given) + ': ' if given else ''}training has unknown fields {unknown}: "
                          f"{hints + '; ' if hints else ''}{refusal}")
    for name in SYNC_POLICIES:
        build_policy(name, options)
    aggregation_options(aggregation, options, topology)
    if topology is not None:  # what the servers would refuse at the wrapper's CONFIGURE (DGT + a WAN codec ...)
        facts = configure_facts(topology.features, compression=training.compression is not None,
                                other_sync=training.sync != DEFAULT_SYNC)
        text = combination_refusal(facts, sync=training.sync, synchronous=SYNCHRONOUS)
        if text is not None:
            raise ConfigError(f"training: {text}")


def aggregation_options(name: str, options: Mapping[str, str], topology: Topology | None) -> dict[str, Any]:
    """The options aggregation ``name`` takes, parsed from ``options`` and checked (against the job's
    ``topology`` when given); ConfigError names what is wrong."""
    cls = AGGREGATIONS[name]
    try:
        parsed = parse_options(f"the {name} aggregation", cls.options, options)
        cls.check_options(parsed, topology)
    except OptionError:
        raise  # it names the option and its owner already
    except ValueError as exc:
        raise ConfigError(f"the {name} aggregation: {exc}") from None
    return parsed


def _aggregation_name(topology: Topology | None) -> str:
    return "hfa" if topology is not None and topology.hfa is not None else "sum"


def _unknown_hints(unknown: list[str], running: str) -> str:
    """What the generic refusal of ``unknown`` options cannot say, as it lists only the running plug-ins' options:
    an option of an aggregation this job does not run (HFA's ``fragments`` without an ``hfa:`` block), or a
    misspelt option of any plug-in (``fragmnets``)."""
    every = {option for cls in (*SYNC_POLICIES.values(), *AGGREGATIONS.values()) for option in cls.options}
    hints = [f"{', '.join(options)} {'is an option' if len(options) == 1 else 'are options'} of the {name} "
             f"aggregation, which this job does not run" + (": add an `hfa:` block to the topology (or set GEOMX_HFA=1)"
                                                             if name == "hfa" else "")
             for name, cls in sorted(AGGREGATIONS.items())
             if name != running and (options := sorted(set(unknown) & set(cls.options)))]
    guesses = [f"{close!r} for {key!r}" for key in unknown if key not in every and (close := closest(key, every))]
    if guesses:
        hints.append(f"did you mean {', '.join(guesses)}?")
    return "; ".join(hints)


def _declared(takers: Mapping[str, Mapping[str, type]]) -> set[str]:
    return {option for declared in takers.values() for option in declared}


def build_policy(name: str, options: Mapping[str, str]) -> SyncPolicy:
    """The sync policy ``name`` with the options it declares, parsed from ``options``; ConfigError names
    what is wrong (an unknown name lists the valid ones)."""
    try:
        cls = SYNC_POLICIES[name]
    except KeyError:
        raise ConfigError(f"unknown kvstore type {name!r}; valid: {sorted(SYNC_POLICIES)}") from None
    try:
        return cls(**parse_options(name, cls.options, options))
    except OptionError:
        raise  # it names the option and its owner already
    except ValueError as exc:  # the policy's own check of a value
        raise ConfigError(f"{name}: {exc}") from None


def compose(config: NodeConfig, host: PluginHost) -> Plugins:
    """Build the plug-ins ``config`` asks for, each bound to ``host``."""
    topology = config.topology
    check_plugins(topology.training, topology)
    choice = choose(config)
    options = dict(topology.training.plugin_options)
    plugins = Plugins(policy=build_policy(choice.sync, options),
                      route=_route(choice, config, host),
                      aggregation=AGGREGATIONS[choice.aggregation].from_config(
                          config, host, **aggregation_options(choice.aggregation, options, topology)),
                      extensions=[EXTENSIONS[name](config, host) for name in choice.extensions],
                      # the fp16 switch: every link's float32 data as float16, unless the master sets a WAN codec
                      encoding=Encoding(wide=FP16() if config.topology.fp16 else None))
    check_kind_claims(plugins)
    return plugins


def check_kind_claims(plugins: Plugins) -> None:
    """ConfigError unless every message kind the plug-ins take is an algorithm's own (a ``PluginKind``) and is
    taken by one plug-in only. The server's handler tables are dicts keyed by kind: a second plug-in's handler
    would silently replace the first's, and one keyed by a core kind would replace the server's own.

    Usage: ``check_kind_claims(plugins)`` (``compose`` does, before the server builds its tables).
    """
    routes = plugins.route.routes if isinstance(plugins.route, RouteChain) else [plugins.route]
    claims: list[tuple[object, Iterable[MessageKind]]] = [(route, route.handlers()) for route in routes]
    claims += [(extension, {*extension.requests(), *extension.completions()}) for extension in plugins.extensions]
    owners: dict[MessageKind, object] = {}
    for owner, kinds in claims:
        for kind in kinds:
            if isinstance(kind, Kind):
                raise ConfigError(f"plug-in {type(owner).__name__} takes the core's {kind.name} messages; a plug-in "
                                  f"takes only kinds of its own (geomx.protocol.wire.PluginKind)")
            other = owners.setdefault(kind, owner)
            if other is not owner:
                raise ConfigError(f"plug-ins {type(other).__name__} and {type(owner).__name__} both take message "
                                  f"kind {kind.name} ({int(kind)})")


def _route(choice: Choice, config: NodeConfig, host: PluginHost) -> Route:
    route = ROUTES[choice.route](config, host)
    if not choice.uplinks:
        return route
    return RouteChain([route, *(ROUTES[name](config, host) for name in choice.uplinks)])


def configured_policy(name: str, options: Mapping[str, str] | None = None) -> SyncPolicy:
    """The policy the master names later (CONFIGURE's ``sync``), from the same registry, with the job's plug-in
    ``options``; ConfigError (a ValueError) lists the valid names."""
    return build_policy(name, options or {})
