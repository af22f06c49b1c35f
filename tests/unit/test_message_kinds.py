"""The message kinds algorithms declare for themselves (``geomx.protocol.wire.PluginKind``): the registry lists
every one, no two share a number, and a server refuses plug-ins that would take one kind twice."""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from collections import defaultdict
from typing import Any

import pytest

import geomx.algorithms
from geomx.algorithms.fsa.server import FullySynchronous
from geomx.algorithms.registry import MESSAGE_KINDS, check_message_kinds
from geomx.algorithms.tsengine.kinds import RELAY
from geomx.config import ConfigError
from geomx.core.plugins import Aggregation, Extension, Route, RouteChain
from geomx.protocol.wire import Kind, MessageKind, PluginKind
from geomx.server.compose import Plugins, check_kind_claims


def declared_kinds() -> dict[str, PluginKind]:
    """Every PluginKind in an algorithm's ``kinds.py`` (where an algorithm declares them), by where it is."""
    found: dict[str, PluginKind] = {}
    for info in pkgutil.iter_modules(geomx.algorithms.__path__):
        name = f"geomx.algorithms.{info.name}.kinds"
        if not info.ispkg or importlib.util.find_spec(name) is None:
            continue
        module = importlib.import_module(name)
        found.update({f"{name}.{attr}": value for attr, value in vars(module).items() if isinstance(value, PluginKind)})
    return found


def test_every_declared_kind_is_in_the_registry() -> None:
    declared = declared_kinds()
    assert {"geomx.algorithms.esync.kinds.STATE", "geomx.algorithms.tsengine.kinds.RELAY"} <= set(declared)
    listed = {(int(kind), kind.name) for kind in MESSAGE_KINDS}
    missing = [where for where, kind in declared.items() if (int(kind), kind.name) not in listed]
    assert not missing, f"declared but not in geomx.algorithms.registry.MESSAGE_KINDS: {missing}"


def test_no_two_declared_kinds_share_a_number() -> None:
    by_number: defaultdict[int, set[str]] = defaultdict(set)
    for kind in [*declared_kinds().values(), *MESSAGE_KINDS]:
        by_number[int(kind)].add(kind.name)
    shared = {number: sorted(names) for number, names in by_number.items() if len(names) > 1}
    assert not shared, f"message kinds sharing a number: {shared}"
    check_message_kinds()  # what geomx launch and every server run at start


def test_the_registry_check_refuses_a_kind_that_takes_another_s_number() -> None:
    squatter = PluginKind(int(RELAY), "test.squatter")
    with pytest.raises(ValueError, match=f"'tsengine.relay' and 'test.squatter' share the number {int(RELAY)}"):
        check_message_kinds([*MESSAGE_KINDS, squatter])


class Claims(Extension):
    """An extension taking the given kinds."""

    def __init__(self, *kinds: MessageKind) -> None:
        self.kinds = kinds

    def requests(self) -> dict[MessageKind, Any]:
        return {kind: print for kind in self.kinds}


class Relays(Route):
    """A route taking TSEngine's relays."""

    def handlers(self) -> dict[MessageKind, Any]:
        return {RELAY: print}


def plugins(route: Route, *extensions: Extension) -> Plugins:
    return Plugins(policy=FullySynchronous(), route=route, aggregation=Aggregation(), extensions=list(extensions))


def test_a_server_refuses_two_plug_ins_taking_one_kind() -> None:
    check_kind_claims(plugins(RouteChain([Relays(), Route()]), Claims(PluginKind(40, "test.mine"))))
    twin = PluginKind(int(RELAY), "test.twin")  # another name, the same number: the same kind on the wire
    with pytest.raises(ConfigError, match=f"Relays and Claims both take message kind test.twin \\({int(RELAY)}\\)"):
        check_kind_claims(plugins(RouteChain([Route(), Relays()]), Claims(twin)))
    with pytest.raises(ConfigError, match="Claims and Claims both take"):
        check_kind_claims(plugins(Route(), Claims(PluginKind(40, "a.x")), Claims(PluginKind(40, "b.x"))))


def test_a_server_refuses_a_plug_in_taking_a_core_kind() -> None:
    with pytest.raises(ConfigError, match="plug-in Claims takes the core's PUSHPULL messages"):
        check_kind_claims(plugins(Route(), Claims(Kind.PUSHPULL)))
