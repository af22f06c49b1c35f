"""GeoMX's own variable names, as its docs set them, work as aliases of ours, and a bad value of each is refused in
one line that names the variable the user set (``DMLC_K='7'``), not our name for it, which they may never have seen
(``geomx.config.fields.lookup_named``)."""

from __future__ import annotations

import pytest

from geomx.config import ConfigError, reference, topology_from_dict
from geomx.config.env import node_config_from_env, topology_from_env

TOPOLOGY = topology_from_dict({"parties": {"dc0": 2, "dc1": 2}})

# GeoMX's launch variables, as its configuration guide sets them, one feature at a time (they do not combine)
SEEDS: list[tuple[dict[str, str], str, object]] = [
    ({"MXNET_KVSTORE_SIZE_LOWER_BOUND": "200000"}, "size_lower_bound", 200000),
    ({"ENABLE_P3": "1"}, "training.p3", True),
    ({"MXNET_KVSTORE_USE_HFA": "1", "MXNET_KVSTORE_HFA_K1": "20", "MXNET_KVSTORE_HFA_K2": "10"}, "hfa", (20, 10)),
    ({"ENABLE_DGT": "2", "DMLC_UDP_CHANNEL_NUM": "3", "DMLC_K": "0.8", "ADAPTIVE_K_FLAG": "1"}, "dgt",
     (3, 0.8, True)),
    ({"ENABLE_INTER_TS": "1", "ENABLE_INTRA_TS": "1", "MAX_GREED_RATE_TS": "0.9"}, "tsengine", (True, True, 0.9)),
]


def _seen(env: dict[str, str], what: str) -> object:
    topology = topology_from_env(TOPOLOGY, env)
    if what == "hfa":
        return topology.hfa.k1, topology.hfa.k2
    if what == "dgt":
        return topology.dgt.channels, topology.dgt.k, topology.dgt.adaptive
    if what == "tsengine":
        return topology.tsengine.inter, topology.tsengine.intra, topology.tsengine.max_greed
    if what == "training.p3":
        return topology.training.p3
    return getattr(topology, what)


@pytest.mark.parametrize(("env", "what", "expected"), SEEDS)
def test_geomx_launch_variables_are_read(env: dict[str, str], what: str, expected: object) -> None:
    assert _seen(env, what) == expected


# (the switch that turns the block on, the alias, a value it refuses)
BAD: list[tuple[dict[str, str], str, str]] = [
    ({}, "MXNET_KVSTORE_SIZE_LOWER_BOUND", "abc"),
    ({}, "MXNET_KVSTORE_SIZE_LOWER_BOUND", "-5"),
    ({}, "ENABLE_P3", "maybe"),
    ({"MXNET_KVSTORE_USE_HFA": "1"}, "MXNET_KVSTORE_HFA_K1", "abc"),
    ({"MXNET_KVSTORE_USE_HFA": "1"}, "MXNET_KVSTORE_HFA_K2", "0"),
    ({"ENABLE_DGT": "2"}, "DMLC_UDP_CHANNEL_NUM", "2.5"),
    ({"ENABLE_DGT": "2"}, "DMLC_K", "abc"),
    ({"ENABLE_DGT": "2"}, "DMLC_K", "7"),
    ({"ENABLE_DGT": "2"}, "ADAPTIVE_K_FLAG", "yes please"),
    ({"ENABLE_DGT": "2"}, "DMLC_K_MIN", "x"),
    ({"ENABLE_DGT": "2"}, "DGT_BLOCK_SIZE", "4.5"),
    ({"ENABLE_DGT": "2"}, "DGT_CONTRIBUTION_ALPHA", "one"),
    ({"ENABLE_DGT": "2"}, "DGT_SET_RANDOM", "2"),
    ({"ENABLE_INTER_TS": "1"}, "ENABLE_INTRA_TS", "2"),
    ({"ENABLE_INTER_TS": "1"}, "MAX_GREED_RATE_TS", "7"),
    ({}, "ENABLE_DGT", "3"),
    ({}, "MXNET_KVSTORE_USE_HFA", "2"),
]


@pytest.mark.parametrize(("switch", "alias", "bad"), BAD)
def test_a_bad_value_of_an_alias_is_one_line_naming_the_alias(switch: dict[str, str], alias: str, bad: str) -> None:
    with pytest.raises(ConfigError) as caught:
        topology_from_env(TOPOLOGY, {**switch, alias: bad})
    text = str(caught.value)
    assert alias in text and "\n" not in text, text


@pytest.mark.parametrize(("alias", "bad"), [("DMLC_K", "7"), ("DGT_CONTRIBUTION_ALPHA", "2"),
                                            ("MAX_GREED_RATE_TS", "-1"), ("MXNET_KVSTORE_HFA_K1", "0")])
def test_a_value_out_of_range_is_refused_even_where_its_block_is_off(alias: str, bad: str) -> None:
    with pytest.raises(ConfigError, match=alias):
        topology_from_env(TOPOLOGY, {alias: bad})


def test_a_bad_process_count_names_the_dmlc_variable() -> None:
    env = {"DMLC_ROLE": "worker", "DMLC_NUM_WORKER": "two", "DMLC_PS_ROOT_URI": "127.0.0.1",
           "DMLC_PS_ROOT_PORT": "9100", "DMLC_PS_GLOBAL_ROOT_URI": "127.0.0.1", "DMLC_PS_GLOBAL_ROOT_PORT": "9000"}
    with pytest.raises(ConfigError, match="DMLC_NUM_WORKER must be an integer"):
        node_config_from_env(env)


def _structure_default(key: str) -> str:
    """The default docs/configuration.md states for the topology's hand-read key ``key``."""
    row = next(line for line in reference.markdown().splitlines() if line.startswith(f"| `{key}` | "))
    return row.split(" | ")[1]


def test_the_structure_tables_defaults_are_the_codes() -> None:
    # `parties` has no default: a topology without it is refused, so the page must not state one
    assert _structure_default("parties") == "required"
    with pytest.raises(ConfigError, match="topology needs 'parties'"):
        topology_from_dict({})
    two, one = topology_from_dict({"parties": {"a": 1, "b": 1}}), topology_from_dict({"parties": {"a": 1}})
    assert _structure_default("central") == "the first party" and two.central == "a"
    assert _structure_default("mode") == f"`{two.mode.value}`"
    several = f"{two.slice_elems:,} with several parties, {one.slice_elems:,} with one"
    assert _structure_default("slice_elems") == several
    assert _structure_default("outages") == "none" and two.outages == ()


GEOMX_STYLE = {"DMLC_ROLE": "worker", "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": "9100",
               "DMLC_PS_GLOBAL_ROOT_URI": "127.0.0.1", "DMLC_PS_GLOBAL_ROOT_PORT": "9000", "DMLC_NUM_WORKER": "2",
               "DMLC_NUM_ALL_WORKER": "4", "DMLC_NUM_GLOBAL_SERVER": "2"}


@pytest.mark.parametrize(("alias", "bad", "text"), [
    ("DMLC_NUM_WORKER", "0", "DMLC_NUM_WORKER must be at least 1, got 0"),  # was read as one worker
    ("DMLC_NUM_ALL_WORKER", "-3", "DMLC_NUM_ALL_WORKER must be at least 1, got -3"),  # was taken
    ("DMLC_NUM_GLOBAL_SERVER", "0", "DMLC_NUM_GLOBAL_SERVER must be at least 1, got 0"),  # was read as one
    ("DMLC_NUM_GLOBAL_SERVER", "-1", "DMLC_NUM_GLOBAL_SERVER must be at least 1, got -1"),  # did not name it
    ("DMLC_NUM_GLOBAL_WORKER", "0", "DMLC_NUM_GLOBAL_WORKER must be at least 1, got 0"),
    ("DMLC_ROLE_MASTER_WORKER", "maybe", "DMLC_ROLE_MASTER_WORKER must be 0 or 1, got 'maybe'"),  # was yes
])
def test_a_bad_geomx_style_process_variable_is_refused_naming_it(alias: str, bad: str, text: str) -> None:
    with pytest.raises(ConfigError) as caught:
        node_config_from_env({**GEOMX_STYLE, alias: bad})
    assert str(caught.value) == text


def test_geomx_style_process_variables_are_read() -> None:
    node = node_config_from_env({**GEOMX_STYLE, "DMLC_ROLE_MASTER_WORKER": "1"})
    assert node.is_master and node.topology.num_global_servers == 2
    assert [p.num_workers for p in node.topology.parties] == [2, 2]
    assert not node_config_from_env({**GEOMX_STYLE, "DMLC_ROLE_MASTER_WORKER": "0"}).is_master
