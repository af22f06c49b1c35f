"""Configuration: units, topology files, and the environment (GEOMX_* names and GeoMX's DMLC_* aliases)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import yaml

from geomx.config import (
    LAN_SLICE_ELEMS,
    WAN_SLICE_ELEMS,
    ConfigError,
    LinkSpec,
    Mode,
    PartySpec,
    Role,
    Timeouts,
    Topology,
    load_topology,
    node_config_from_env,
    node_env,
    parse_bandwidth,
    parse_duration,
    topology_from_dict,
    topology_to_dict,
)

REPO = Path(__file__).resolve().parents[2]

DEMO = {
    "parties": {"dc0": {"workers": 2}, "dc1": {"workers": 3}},
    "central": "dc0",
    "global_servers": 2,
    "mode": "hips",
    "links": {"lan": {"bandwidth": "10Gbit", "latency": "0ms"},
              "wan": {"bandwidth": "100Mbit", "latency": "25ms"}},
    "timeouts": {"register": "60s", "request": "2s", "round": "1500ms", "shutdown": 30},
    "slice_elems": 4096,
    "max_message_bytes": 1 << 24,
}


def demo(**changes):
    raw = dict(DEMO)
    raw.update(changes)
    return raw


def write_topology(tmp_path: Path, raw) -> Path:
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


# ---------------------------------------------------------------------------------------------------------
# parse_bandwidth / parse_duration


@pytest.mark.parametrize("text,bps", [
    ("100Mbit", 100e6),
    ("100 Mbit", 100e6),
    ("10Gbit/s", 10e9),
    ("10 Gbit/s", 10e9),
    ("1gbit", 1e9),
    ("5kbit", 5e3),
    ("2Tbit", 2e12),
    ("1.5Mbit", 1.5e6),
    ("1e8", 1e8),
    ("250000", 250e3),
    ("100Mbps", 100e6),
    ("10MB", 80e6),  # an upper-case "B" means bytes: x8 (a lower-case "b" means bits)
    ("1KB/s", 8e3),
    (1e6, 1e6),
    (42, 42.0),
])
def test_parse_bandwidth_units(text, bps):
    assert parse_bandwidth(text) == pytest.approx(bps)


@pytest.mark.parametrize("text", [None, "unlimited", "UNLIMITED", "none", "inf", "", "  "])
def test_parse_bandwidth_unlimited(text):
    assert parse_bandwidth(text) is None


@pytest.mark.parametrize("text", ["fast", "100 parsecs", "100Xbit", "Mbit", "10 Gbit/h", "0Mbit", "-5Mbit", "0",
                                  0, -1, -0.5])
def test_parse_bandwidth_errors(text):
    with pytest.raises(ConfigError, match="bandwidth"):
        parse_bandwidth(text)


@pytest.mark.parametrize("parse,text", [(parse_bandwidth, "1..5Mbit"), (parse_bandwidth, "eMbit"),
                                        (parse_duration, "1..2ms"), (parse_duration, "1es")])
def test_malformed_numbers_are_config_errors(parse, text):
    with pytest.raises(ConfigError, match="cannot read"):
        parse(text)


@pytest.mark.parametrize("text,seconds", [
    ("25ms", 0.025),
    ("25 ms", 0.025),
    ("0.5s", 0.5),
    ("1.5S", 1.5),
    ("100us", 100e-6),
    ("3", 3.0),
    ("0ms", 0.0),
    ("1e-3s", 1e-3),
    (0.025, 0.025),
    (2, 2.0),
    (None, 0.0),
])
def test_parse_duration_units(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["soon", "5 minutes", "5d", "5mh", "ms", "-5ms", -1, -0.001])  # 5m, 5h: durations
def test_parse_duration_errors(text):
    with pytest.raises(ConfigError, match="duration"):
        parse_duration(text)


# ---------------------------------------------------------------------------------------------------------
# Topology


def test_topology_from_dict_full():
    topology = topology_from_dict(DEMO)
    assert topology.parties == (PartySpec("dc0", 2), PartySpec("dc1", 3))
    assert topology.central == "dc0"
    assert topology.num_global_servers == 2
    assert topology.mode is Mode.HIPS
    assert topology.lan == LinkSpec(10e9, 0.0)
    assert topology.wan == LinkSpec(100e6, 0.025)
    assert topology.wan.is_emulated and topology.lan.is_emulated
    assert topology.timeouts == Timeouts(register_s=60.0, request_s=2.0, round_s=1.5, shutdown_s=30.0)
    assert topology.slice_elems == 4096
    assert topology.max_message_bytes == 1 << 24


def test_topology_defaults():
    topology = topology_from_dict({"parties": {"a": 1, "b": {"workers": 2}}})
    assert topology.central == "a"  # the first party
    assert topology.num_global_servers == 1
    assert topology.mode is Mode.HIPS
    assert topology.lan == LinkSpec() and not topology.lan.is_emulated
    assert topology.wan == LinkSpec()
    assert topology.timeouts == Timeouts()
    # two parties: a WAN, so slices small enough to pipeline; one party: the LAN's larger slices
    assert topology.slice_elems == WAN_SLICE_ELEMS == Topology(topology.parties, "a").slice_elems
    assert topology_from_dict({"parties": {"a": 2}}).slice_elems == LAN_SLICE_ELEMS
    assert topology_from_dict({"parties": {"a": 1, "b": 1}, "slice_elems": 1 << 20}).slice_elems == 1 << 20


def test_worker_offset_and_num_all_workers():
    topology = topology_from_dict({"parties": {"a": 2, "b": 3, "c": 1}})
    assert topology.num_all_workers == 6
    assert [topology.worker_offset(p) for p in ("a", "b", "c")] == [0, 2, 5]
    assert topology.party("b").num_workers == 3
    with pytest.raises(ConfigError, match="unknown party"):
        topology.worker_offset("zz")
    with pytest.raises(ConfigError, match="unknown party"):
        topology.party("zz")


@pytest.mark.parametrize("path", sorted((REPO / "topologies").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_topologies_load(path):
    topology = load_topology(path)
    assert topology.num_all_workers >= 1
    assert topology.central in {p.name for p in topology.parties}


def test_load_topology_good_file(tmp_path):
    topology = load_topology(write_topology(tmp_path, DEMO))
    assert topology == topology_from_dict(DEMO)


def test_load_topology_flat_mode(tmp_path):
    assert load_topology(write_topology(tmp_path, demo(mode="FLAT"))).mode is Mode.FLAT


def test_load_topology_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read topology file"):
        load_topology(tmp_path / "nope.yaml")


def test_load_topology_invalid_yaml(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("parties: {dc0: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_topology(path)


def test_load_topology_empty_file(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("")
    with pytest.raises(ConfigError, match="mapping"):
        load_topology(path)


@pytest.mark.parametrize("raw,match", [
    (demo(gpus=4), r"unknown fields \['gpus'\]"),
    (demo(links={"lan": {}, "wan": {}, "sat": {}}), "only 'lan' and 'wan'"),
    (demo(links={"wan": {"bandwidth": "1Gbit", "jitter": "1ms"}}), r"links.wan has unknown fields \['jitter'\]"),
    (demo(links={"wan": "1Gbit"}), "links.wan must be a mapping"),
    (demo(timeouts={"register": "1s", "forever": "2s"}), r"timeouts has unknown fields \['forever'\]"),
    (demo(timeouts=5), "timeouts must be a mapping"),
], ids=["top-level", "links", "link", "link-not-mapping", "timeouts", "timeouts-not-mapping"])
def test_unknown_fields_rejected(tmp_path, raw, match):
    with pytest.raises(ConfigError, match=match):
        load_topology(write_topology(tmp_path, raw))


def test_unknown_mode(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown mode 'ring'.*hips.*flat"):
        load_topology(write_topology(tmp_path, demo(mode="ring")))


@pytest.mark.parametrize("name", ["dc 1", "dc/1", "dc:1", "dç"])
def test_bad_party_names(tmp_path, name):
    raw = demo(parties={"dc0": {"workers": 1}, name: {"workers": 1}})
    with pytest.raises(ConfigError, match="may hold only letters"):
        load_topology(write_topology(tmp_path, raw))


def test_central_not_a_party(tmp_path):
    with pytest.raises(ConfigError, match=r"central party 'dc9' is not one of the parties \['dc0', 'dc1'\]"):
        load_topology(write_topology(tmp_path, demo(central="dc9")))


@pytest.mark.parametrize("workers", [0, -1])
def test_no_workers_in_a_party(tmp_path, workers):
    raw = demo(parties={"dc0": {"workers": 2}, "dc1": {"workers": workers}})
    with pytest.raises(ConfigError, match="party 'dc1' needs at least one worker"):
        load_topology(write_topology(tmp_path, raw))


@pytest.mark.parametrize("parties,match", [
    ({}, "needs 'parties'"),
    ([{"dc0": 1}], "needs 'parties'"),
    ({"dc0": {"workers": "two"}}, "party 'dc0' needs an integer 'workers'"),
    ({"dc0": {"workers": True}}, "party 'dc0' needs an integer 'workers'"),
    ({"dc0": {}}, "party 'dc0' needs an integer 'workers'"),
])
def test_bad_parties(parties, match):
    with pytest.raises(ConfigError, match=match):
        topology_from_dict(demo(parties=parties))


def test_not_a_mapping():
    with pytest.raises(ConfigError, match="mapping"):
        topology_from_dict(["parties"])  # type: ignore[arg-type]


def test_direct_construction_validates():
    with pytest.raises(ConfigError, match="no parties"):
        Topology(parties=(), central="a")
    with pytest.raises(ConfigError, match="unique"):
        Topology(parties=(PartySpec("a", 1), PartySpec("a", 1)), central="a")
    with pytest.raises(ConfigError, match="num_global_servers"):
        Topology(parties=(PartySpec("a", 1),), central="a", num_global_servers=0)
    with pytest.raises(ConfigError, match="slice_elems"):
        Topology(parties=(PartySpec("a", 1),), central="a", slice_elems=-1)
    with pytest.raises(ConfigError, match="slice_elems must be positive, got 0"):  # 0 is "auto" only in Python
        topology_from_dict({"parties": {"a": 1}, "slice_elems": 0})


@pytest.mark.parametrize("raw", [DEMO, {"parties": {"x": 1}}, demo(mode="flat", links={"wan": {"latency": "1ms"}})],
                         ids=["demo", "minimal", "flat"])
def test_topology_to_dict_round_trip(tmp_path, raw):
    topology = topology_from_dict(raw)
    as_dict = topology_to_dict(topology)
    assert topology_from_dict(as_dict) == topology
    # and through a YAML file, as the launcher writes it next to a run
    assert load_topology(write_topology(tmp_path, as_dict)) == topology


# ---------------------------------------------------------------------------------------------------------
# Environment

GS = "10.0.0.9:9100"


@pytest.fixture
def topo_file(tmp_path):
    return str(write_topology(tmp_path, DEMO))


def geomx_env(topo_file, **extra):
    env = {"GEOMX_TOPOLOGY": topo_file, "GEOMX_GLOBAL_SCHEDULER": GS}
    env.update(extra)
    return env


def test_geomx_env_worker(topo_file, tmp_path):
    env = geomx_env(topo_file, GEOMX_ROLE="worker", GEOMX_PARTY="dc1", GEOMX_SCHEDULER="10.0.0.1:9000",
                    GEOMX_RANK="2", GEOMX_HOST="10.0.0.5", GEOMX_RUN_DIR=str(tmp_path))
    node = node_config_from_env(env)
    assert node.role is Role.WORKER
    assert node.party == "dc1"
    assert node.topology == load_topology(topo_file)
    assert node.global_scheduler == GS
    assert node.scheduler == "10.0.0.1:9000"
    assert node.rank == 2
    assert node.is_master is False
    assert node.bind_host == "10.0.0.5"
    assert node.bind_port == 0
    assert node.run_dir == tmp_path
    assert node.num_workers == 3


def test_geomx_env_schedulers_bind_their_port(topo_file):
    gsched = node_config_from_env(geomx_env(topo_file, GEOMX_ROLE="global_scheduler", GEOMX_PARTY="dc0"))
    assert gsched.role is Role.GLOBAL_SCHEDULER and gsched.bind_port == 9100
    local = node_config_from_env(geomx_env(topo_file, GEOMX_ROLE="local_scheduler", GEOMX_PARTY="dc1",
                                           GEOMX_SCHEDULER="10.0.0.1:9000"))
    assert local.role is Role.LOCAL_SCHEDULER and local.bind_port == 9000


def test_geomx_timeout_overrides_topology(topo_file):
    node = node_config_from_env(geomx_env(topo_file, GEOMX_ROLE="global_server", GEOMX_PARTY="dc0",
                                          GEOMX_TIMEOUT="7s"))
    assert (node.topology.timeouts.register_s, node.topology.timeouts.request_s,
            node.topology.timeouts.round_s) == (7.0, 7.0, 7.0)
    assert node.topology.timeouts.shutdown_s == 30.0


def test_node_env_round_trip(topo_file, tmp_path):
    original = node_config_from_env(geomx_env(topo_file, GEOMX_ROLE="worker", GEOMX_PARTY="dc0",
                                              GEOMX_SCHEDULER="127.0.0.1:9000", GEOMX_RANK="0",
                                              GEOMX_MASTER_WORKER="1", GEOMX_RUN_DIR=str(tmp_path)))
    assert original.is_master
    assert node_config_from_env(node_env(original, Path(topo_file))) == original


@pytest.mark.parametrize("value,expected", [("1", True), ("true", True), ("0", False), ("false", False),
                                            ("", False)])
def test_master_worker_flag(topo_file, value, expected):
    env = geomx_env(topo_file, GEOMX_ROLE="worker", GEOMX_PARTY="dc0", GEOMX_SCHEDULER="h:1",
                    GEOMX_MASTER_WORKER=value)
    assert node_config_from_env(env).is_master is expected


# -- GeoMX's DMLC_* names ---------------------------------------------------------------------------------

LOCAL = {"DMLC_PS_ROOT_URI": "10.0.0.1", "DMLC_PS_ROOT_PORT": "9093"}
GLOBAL = {"DMLC_PS_GLOBAL_ROOT_URI": "10.0.0.9", "DMLC_PS_GLOBAL_ROOT_PORT": "9092"}


@pytest.mark.parametrize("env,role", [
    ({"DMLC_ROLE": "worker"}, Role.WORKER),
    ({"DMLC_ROLE": "server"}, Role.LOCAL_SERVER),
    ({"DMLC_ROLE": "scheduler"}, Role.LOCAL_SCHEDULER),
    ({"DMLC_ROLE": "server", "DMLC_ROLE_GLOBAL": "global_server"}, Role.GLOBAL_SERVER),
    ({"DMLC_ROLE_GLOBAL": "global_server"}, Role.GLOBAL_SERVER),
    ({"DMLC_ROLE_GLOBAL": "global_scheduler"}, Role.GLOBAL_SCHEDULER),
], ids=["worker", "server", "scheduler", "server+global_server", "global_server", "global_scheduler"])
def test_dmlc_roles(env, role):
    node = node_config_from_env({**env, **LOCAL, **GLOBAL})
    assert node.role is role


def test_dmlc_addresses():
    node = node_config_from_env({"DMLC_ROLE": "worker", **LOCAL, **GLOBAL})
    assert node.scheduler == "10.0.0.1:9093"
    assert node.global_scheduler == "10.0.0.9:9092"
    # without GEOMX_PARTY the party is derived from the local scheduler's address, so it is unique per party
    assert node.party == "10-0-0-1-9093"
    assert node.topology.party(node.party).num_workers == 1


def test_dmlc_scheduler_binds_root_port():
    node = node_config_from_env({"DMLC_ROLE": "scheduler", **LOCAL, **GLOBAL})
    assert node.bind_port == 9093
    gsched = node_config_from_env({"DMLC_ROLE_GLOBAL": "global_scheduler", **GLOBAL})
    assert gsched.bind_port == 9092


def test_dmlc_counts_and_master():
    env = {"DMLC_ROLE": "worker", "DMLC_NUM_WORKER": "2", "DMLC_NUM_ALL_WORKER": "6",
           "DMLC_NUM_GLOBAL_WORKER": "3", "DMLC_NUM_GLOBAL_SERVER": "2", "DMLC_ROLE_MASTER_WORKER": "1",
           **LOCAL, **GLOBAL}
    node = node_config_from_env(env)
    assert node.num_workers == 2
    assert node.topology.num_all_workers == 6
    assert len(node.topology.parties) == 3
    assert node.topology.num_global_servers == 2
    assert node.is_master is True
    assert node.topology.worker_offset(node.party) == 0


@pytest.mark.parametrize("num_parties,all_workers,num_workers", [(2, 4, 2), (3, 7, 2), (4, 10, 1), (2, 9, 5)])
def test_dmlc_placeholder_parties_sum_to_all_workers(num_parties, all_workers, num_workers):
    env = {"DMLC_ROLE": "worker", "DMLC_NUM_WORKER": str(num_workers), "DMLC_NUM_ALL_WORKER": str(all_workers),
           "DMLC_NUM_GLOBAL_WORKER": str(num_parties), **LOCAL, **GLOBAL}
    topology = node_config_from_env(env).topology
    assert topology.num_all_workers == all_workers
    assert len(topology.parties) == num_parties
    assert topology.parties[0].num_workers == num_workers


def test_dmlc_num_all_worker_without_num_global_worker():
    # GeoMX's own master-worker launch line (scripts/cpu/run_vanilla_hips.sh)
    env = {"DMLC_ROLE": "worker", "DMLC_ROLE_MASTER_WORKER": "1", "DMLC_NUM_SERVER": "1",
           "DMLC_NUM_WORKER": "1", "DMLC_NUM_ALL_WORKER": "4", **LOCAL, **GLOBAL}
    node = node_config_from_env(env)
    assert node.is_master
    assert node.topology.num_all_workers == 4


def test_geomx_names_win_over_dmlc(topo_file):
    env = {
        "GEOMX_ROLE": "local_server", "DMLC_ROLE": "worker", "DMLC_ROLE_GLOBAL": "global_scheduler",
        "GEOMX_PARTY": "dc1",
        "GEOMX_SCHEDULER": "1.1.1.1:1111", "GEOMX_GLOBAL_SCHEDULER": "2.2.2.2:2222",
        "GEOMX_MASTER_WORKER": "0", "DMLC_ROLE_MASTER_WORKER": "1",
        "GEOMX_HOST": "3.3.3.3", "DMLC_NODE_HOST": "4.4.4.4",
        "GEOMX_TOPOLOGY": topo_file,
        **LOCAL, **GLOBAL,
    }
    node = node_config_from_env(env)
    assert node.role is Role.LOCAL_SERVER
    assert node.party == "dc1"
    assert node.scheduler == "1.1.1.1:1111"
    assert node.global_scheduler == "2.2.2.2:2222"
    assert node.is_master is False
    assert node.bind_host == "3.3.3.3"


def test_geomx_counts_win_over_dmlc():
    env = {"DMLC_ROLE": "worker", "GEOMX_NUM_WORKERS": "3", "DMLC_NUM_WORKER": "1",
           "GEOMX_NUM_PARTIES": "2", "DMLC_NUM_GLOBAL_WORKER": "5",
           "GEOMX_NUM_ALL_WORKERS": "5", "DMLC_NUM_ALL_WORKER": "50",
           "GEOMX_NUM_GLOBAL_SERVERS": "3", "DMLC_NUM_GLOBAL_SERVER": "1", **LOCAL, **GLOBAL}
    node = node_config_from_env(env)
    assert node.num_workers == 3
    assert len(node.topology.parties) == 2
    assert node.topology.num_all_workers == 5
    assert node.topology.num_global_servers == 3


def test_dmlc_aliases_used_when_geomx_empty():
    env = {"DMLC_ROLE": "worker", "GEOMX_NUM_WORKERS": "", "DMLC_NUM_WORKER": "4", "DMLC_NODE_HOST": "4.4.4.4",
           **LOCAL, **GLOBAL}
    node = node_config_from_env(env)
    assert node.num_workers == 4
    assert node.bind_host == "4.4.4.4"


# -- errors -----------------------------------------------------------------------------------------------


def test_missing_role():
    with pytest.raises(ConfigError, match="no role: set GEOMX_ROLE"):
        node_config_from_env({**LOCAL, **GLOBAL})


@pytest.mark.parametrize("env,match", [
    ({"GEOMX_ROLE": "boss"}, "GEOMX_ROLE='boss' is not a role"),
    ({"DMLC_ROLE": "master"}, "DMLC_ROLE='master'; valid: scheduler, server, worker"),
    ({"DMLC_ROLE_GLOBAL": "global_worker"}, "DMLC_ROLE_GLOBAL='global_worker'; valid"),
])
def test_bad_role_names(env, match):
    with pytest.raises(ConfigError, match=match):
        node_config_from_env({**env, **LOCAL, **GLOBAL})


def test_missing_global_scheduler_address():
    with pytest.raises(ConfigError, match="no global scheduler address: set GEOMX_GLOBAL_SCHEDULER"):
        node_config_from_env({"DMLC_ROLE": "worker", **LOCAL})
    with pytest.raises(ConfigError, match="no global scheduler address"):
        node_config_from_env({"DMLC_ROLE": "worker", "DMLC_PS_GLOBAL_ROOT_URI": "10.0.0.9", **LOCAL})


@pytest.mark.parametrize("role", ["worker", "server", "scheduler"])
def test_missing_local_scheduler_address(role):
    with pytest.raises(ConfigError, match=r"role .* needs its party's scheduler: set GEOMX_SCHEDULER"):
        node_config_from_env({"DMLC_ROLE": role, "GEOMX_PARTY": "dc0", **GLOBAL})


def test_flat_worker_needs_no_local_scheduler(tmp_path):
    path = str(write_topology(tmp_path, demo(mode="flat")))
    node = node_config_from_env({"GEOMX_ROLE": "worker", "GEOMX_PARTY": "dc1", "GEOMX_TOPOLOGY": path,
                                 "GEOMX_GLOBAL_SCHEDULER": GS})
    assert node.scheduler is None and node.topology.mode is Mode.FLAT


@pytest.mark.parametrize("value", ["localhost", "host:port", ":9000", "a b:1"])
def test_bad_address_format(topo_file, value):
    with pytest.raises(ConfigError, match="must be HOST:PORT"):
        node_config_from_env(geomx_env(topo_file, GEOMX_ROLE="global_server", GEOMX_PARTY="dc0",
                                       GEOMX_GLOBAL_SCHEDULER=value))


def test_party_not_in_topology(topo_file):
    with pytest.raises(ConfigError, match=r"GEOMX_PARTY='dc7' is not a party of the topology \['dc0', 'dc1'\]"):
        node_config_from_env(geomx_env(topo_file, GEOMX_ROLE="global_server", GEOMX_PARTY="dc7"))


def test_non_integer_count():
    with pytest.raises(ConfigError, match="DMLC_NUM_WORKER must be an integer"):
        node_config_from_env({"DMLC_ROLE": "worker", "DMLC_NUM_WORKER": "two", **LOCAL, **GLOBAL})
    with pytest.raises(ConfigError, match="GEOMX_RANK must be an integer"):
        node_config_from_env({"DMLC_ROLE": "worker", "GEOMX_RANK": "x", **LOCAL, **GLOBAL})


def test_bad_timeout_env(topo_file):
    with pytest.raises(ConfigError, match="duration"):
        node_config_from_env(geomx_env(topo_file, GEOMX_ROLE="global_server", GEOMX_PARTY="dc0",
                                       GEOMX_TIMEOUT="forever"))


def test_node_config_is_frozen(topo_file):
    node = node_config_from_env(geomx_env(topo_file, GEOMX_ROLE="global_server", GEOMX_PARTY="dc0"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        node.rank = 3  # type: ignore[misc]
    assert math.isclose(node.topology.wan.latency_s, 0.025)


def test_a_party_can_have_its_own_wan_link():
    topology = topology_from_dict({
        "parties": {"dc0": {"workers": 1}, "dc1": {"workers": 1, "wan": {"bandwidth": "10Mbit", "latency": "80ms"}},
                    "dc2": 1},
        "links": {"wan": {"bandwidth": "100Mbit", "latency": "25ms"}},
    })
    assert topology.wan_between("dc0", "dc1") == LinkSpec(10e6, 0.08)
    assert topology.wan_between("dc1", "dc0") == LinkSpec(10e6, 0.08)
    assert topology.wan_between("dc0", "dc2") == LinkSpec(100e6, 0.025)
    assert topology_from_dict(topology_to_dict(topology)) == topology
    with pytest.raises(ConfigError, match="unknown fields"):
        topology_from_dict({"parties": {"dc0": {"workers": 1, "cpus": 3}}})


# ---------------------------------------------------------------------------------------------------------
# outages (emulated WAN cut-offs)


def test_outages_parse_round_trip_and_travel_with_the_job_start(tmp_path):
    raw = demo(outages=[{"party": "dc1", "start": "20s", "duration": "1500ms"},
                        {"party": "dc0", "start": "2s", "duration": "1s", "from": "training"}])
    topology = topology_from_dict(raw)
    assert [(o.party, o.start_s, o.end_s, o.origin) for o in topology.outages] == [
        ("dc1", 20.0, 21.5, "launch"), ("dc0", 2.0, 3.0, "training")]
    assert topology_from_dict(topology_to_dict(topology)).outages == topology.outages
    env = geomx_env(str(write_topology(tmp_path, raw)), GEOMX_ROLE="global_server", GEOMX_PARTY="dc0",
                    GEOMX_JOB_START="1700000000.25")
    node = node_config_from_env(env)
    assert node.topology.job_start == 1_700_000_000.25 and node.topology.outages == topology.outages
    assert node_env(node, tmp_path / "topology.yaml")["GEOMX_JOB_START"] == "1700000000.25"  # the launcher's


@pytest.mark.parametrize("outages,match", [
    ([{"party": "dc9", "start": 1, "duration": 1}], "outage names party 'dc9'"),
    ([{"party": "dc1", "start": 1}], r"outages\[0\] must be a mapping with exactly 'party', 'start' and 'duration'"),
    ([{"party": "dc1", "start": 1, "duration": 0}], "needs start >= 0 and duration > 0"),
    ([{"party": "dc1", "start": 1, "duration": 1, "from": "boot"}], r"'from' must be one of \['launch', 'training'\]"),
    ({"party": "dc1"}, "'outages' must be a list"),
])
def test_bad_outages_are_named(outages, match):
    with pytest.raises(ConfigError, match=match):
        topology_from_dict(demo(outages=outages))


def test_bad_job_start_is_named(tmp_path):
    env = geomx_env(str(write_topology(tmp_path, DEMO)), GEOMX_ROLE="global_server", GEOMX_PARTY="dc0",
                    GEOMX_JOB_START="yesterday")
    with pytest.raises(ConfigError, match="GEOMX_JOB_START 'yesterday'"):
        node_config_from_env(env)


def test_a_partys_access_link_parses_and_round_trips():
    raw = demo(parties={"dc0": {"workers": 2, "access": "50Mbit"}, "dc1": {"workers": 1}})
    topology = topology_from_dict(raw)
    assert topology.access_bps("dc0") == 50e6 and topology.access_bps("dc1") is None
    assert topology_from_dict(topology_to_dict(topology)) == topology
    with pytest.raises(ConfigError, match="bandwidth"):
        topology_from_dict(demo(parties={"dc0": {"workers": 2, "access": "fast"}}))
