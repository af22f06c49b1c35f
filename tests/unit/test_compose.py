"""The composition root: a node's config picks its server's plug-ins by registry name."""

from __future__ import annotations

from typing import Any

import pytest

from geomx.algorithms.esync.kinds import STATE
from geomx.algorithms.esync.server import StateRounds
from geomx.algorithms.fsa.server import FullySynchronous
from geomx.algorithms.hfa.server import HfaAggregation
from geomx.algorithms.mixed_sync.server import Asynchronous
from geomx.algorithms.tsengine.server import TsEngineRoute
from geomx.config import NodeConfig, Role, load_topology
from geomx.core.plugins import Aggregation, Route
from geomx.server.compose import Choice, choose, compose, configured_policy


def node(tmp_path: Any, role: Role, extra: str = "") -> NodeConfig:
    path = tmp_path / "t.yaml"
    path.write_text("parties:\n  dc0: {workers: 1}\n  dc1: {workers: 1}\n" + extra)
    return NodeConfig(role=role, party="dc0", topology=load_topology(path), global_scheduler="127.0.0.1:1",
                      rank=0 if role is Role.GLOBAL_SERVER else None)


def test_a_plain_job_runs_the_direct_route_the_plain_sum_and_fsa(tmp_path: Any, make_server: Any) -> None:
    config = node(tmp_path, Role.GLOBAL_SERVER)
    assert choose(config) == Choice()
    plugins = compose(config, make_server("gs", ["ls0"]))
    assert type(plugins.route) is Route and type(plugins.aggregation) is Aggregation
    assert isinstance(plugins.policy, FullySynchronous)
    assert isinstance(plugins.extensions[0], StateRounds) and STATE in plugins.requests()
    assert STATE in plugins.completions()


@pytest.mark.parametrize("role", [Role.GLOBAL_SERVER, Role.LOCAL_SERVER])
def test_hfa_or_tsengine_in_the_topology_pick_their_plug_ins(tmp_path: Any, make_server: Any, role: Role) -> None:
    global_server = role is Role.GLOBAL_SERVER
    hfa = node(tmp_path, role, "hfa: {k1: 2, k2: 3}\n")
    assert choose(hfa) == Choice(aggregation="hfa")
    aggregation = compose(hfa, make_server("s", ["c"])).aggregation
    assert isinstance(aggregation, HfaAggregation)
    assert (aggregation.local is None) is global_server  # a local server counts HFA's K2
    tsengine = node(tmp_path, role, "tsengine: {inter: true}\n")
    assert choose(tsengine) == Choice(route="tsengine")
    route = compose(tsengine, make_server("s", ["c"])).route
    assert isinstance(route, TsEngineRoute)
    assert route.member is not global_server and (route.ts is not None) is global_server


def test_the_master_may_name_another_policy_from_the_same_registry() -> None:
    assert isinstance(configured_policy("dist_async"), Asynchronous)
    with pytest.raises(ValueError, match="unknown kvstore type"):
        configured_policy("dist_nope")


@pytest.mark.parametrize("tsengine", [False, True])
def test_dgt_is_an_uplink_route_chained_after_the_party_s_route(tmp_path: Any, make_server: Any,
                                                                 tsengine: bool) -> None:
    from geomx.algorithms.dgt.server import DgtRoute
    from geomx.core.plugins import RouteChain

    extra = "dgt: {k: 0.5}\n" + ("tsengine: {inter: false, intra: true}\n" if tsengine else "")
    config = node(tmp_path, Role.LOCAL_SERVER, extra)
    assert choose(config) == Choice(route="tsengine" if tsengine else "direct", uplinks=("dgt",))
    route = compose(config, make_server("s", ["c"])).route
    assert isinstance(route, RouteChain) and isinstance(route.routes[-1], DgtRoute)
    assert isinstance(route.routes[0], TsEngineRoute) is tsengine
