"""DGT and TSEngine settings: topology blocks, GeoMX's variable names, and the combinations refused at start."""

from __future__ import annotations

from pathlib import Path

import pytest

from geomx.config import ConfigError, DGTSpec, TSEngineSpec, load_topology, node_config_from_env, topology_from_dict

TOPOLOGIES = Path(__file__).resolve().parents[2] / "topologies"
BASE = {"parties": {"dc0": 1, "dc1": 1}, "central": "dc0"}


def env_for(tmp_path, topology: dict, **extra: str) -> dict[str, str]:
    import yaml

    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(topology))
    return {"GEOMX_ROLE": "local_server", "GEOMX_PARTY": "dc1", "GEOMX_TOPOLOGY": str(path),
            "GEOMX_GLOBAL_SCHEDULER": "127.0.0.1:9000", "GEOMX_SCHEDULER": "127.0.0.1:9001", **extra}


def test_geomx_variable_names_turn_dgt_on(tmp_path):
    env = env_for(tmp_path, BASE, ENABLE_DGT="2", DMLC_UDP_CHANNEL_NUM="2", DMLC_K="0.6", ADAPTIVE_K_FLAG="1",
                  DMLC_K_MIN="0.3", DGT_BLOCK_SIZE="1024", DGT_CONTRIBUTION_ALPHA="0.5", GEOMX_DGT_LOSS="0.01,0.02")
    spec = node_config_from_env(env).topology.dgt
    assert spec == DGTSpec(channels=2, k=0.6, adaptive=True, k_min=0.3, block_bytes=1024, alpha=0.5,
                           loss=(0.01, 0.02))
    assert spec.loss_of(2) == 0.02
    assert node_config_from_env(env_for(tmp_path, {**BASE, "dgt": True}, ENABLE_DGT="0")).topology.dgt is None


def test_geomx_variable_names_turn_tsengine_on(tmp_path):
    env = env_for(tmp_path, BASE, ENABLE_INTER_TS="1", MAX_GREED_RATE_TS="0.7")
    assert node_config_from_env(env).topology.tsengine == TSEngineSpec(max_greed=0.7)
    intra = node_config_from_env(env_for(tmp_path, BASE, ENABLE_INTRA_TS="1")).topology
    assert intra.tsengine == TSEngineSpec(inter=False, intra=True)
    assert intra.intra_ts and not intra.inter_ts
    both = node_config_from_env(env_for(tmp_path, BASE, ENABLE_INTRA_TS="1", ENABLE_INTER_TS="1")).topology
    assert both.intra_ts and both.inter_ts
    # the variables switch the topology's block on and off
    on = {**BASE, "tsengine": {"max_greed": 0.5, "intra": True}}
    assert node_config_from_env(env_for(tmp_path, on, ENABLE_INTER_TS="0")).topology.tsengine == \
        TSEngineSpec(max_greed=0.5, inter=False, intra=True)
    assert node_config_from_env(env_for(tmp_path, on, ENABLE_INTER_TS="0", ENABLE_INTRA_TS="0")).topology.tsengine \
        is None


def test_tsengine_block_round_trips_and_checks_its_switches():
    from geomx.config import topology_to_dict

    topology = topology_from_dict({**BASE, "tsengine": {"intra": True, "inter": False, "seed": 3}})
    assert topology.tsengine == TSEngineSpec(seed=3, inter=False, intra=True)
    assert topology_from_dict(topology_to_dict(topology)).tsengine == topology.tsengine
    assert topology_from_dict({**BASE, "tsengine": {"inter": False}}).tsengine is None
    with pytest.raises(ConfigError, match=r"tsengine\.intra must be true or false"):
        topology_from_dict({**BASE, "tsengine": {"intra": "yes"}})


@pytest.mark.parametrize(("extra", "match"), [
    ({"ENABLE_DGT": "3"}, "mode 3"),
    ({"ENABLE_DGT": "1", "DMLC_K": "1.5"}, "k_min <= k <= 1"),
    ({"ENABLE_DGT": "1", "DMLC_UDP_CHANNEL_NUM": "9"}, "1..7"),
    ({"ENABLE_DGT": "1", "DGT_BLOCK_SIZE": "100000"}, "one UDP"),
    ({"ENABLE_DGT": "1", "GEOMX_DGT_LOSS": "0.1,0.2"}, "one per channel"),
    ({"ENABLE_INTER_TS": "1", "MAX_GREED_RATE_TS": "2"}, "MAX_GREED_RATE_TS"),
])
def test_bad_values_fail_at_start(tmp_path, extra, match):
    with pytest.raises(ConfigError, match=match):
        node_config_from_env(env_for(tmp_path, BASE, **extra))


@pytest.mark.parametrize(("raw", "match"), [
    ({"mode": "flat", "dgt": True}, "DGT .* flat parameter server"),
    ({"hfa": {"k1": 2, "k2": 2}, "dgt": True}, "DGT .* HFA"),
    ({"fp16": True, "dgt": True}, "DGT .* fp16"),
    ({"security": {"secret": "correct horse battery"}, "dgt": True}, "DGT .* security"),
    ({"mode": "flat", "tsengine": True}, "TSEngine .* flat parameter server"),
    ({"dgt": True, "tsengine": True}, "TSEngine .* DGT"),
    ({"hfa": {"k1": 2, "k2": 2}, "tsengine": True}, "TSEngine .* HFA"),
    ({"mode": "flat", "tsengine": {"intra": True, "inter": False}}, "ENABLE_INTRA_TS.* flat parameter server"),
    ({"fp16": True, "tsengine": {"intra": True, "inter": False}}, "ENABLE_INTRA_TS.* fp16"),
])
def test_unsupported_combinations_fail_at_start(raw, match):
    with pytest.raises(ConfigError, match=match):
        topology_from_dict({**BASE, **raw})


def test_shipped_topologies_load():
    assert load_topology(TOPOLOGIES / "dgt.yaml").dgt == DGTSpec(k=0.8, adaptive=True, loss=(0.01,))
    assert load_topology(TOPOLOGIES / "tsengine.yaml").tsengine == TSEngineSpec(max_greed=0.9, intra=True)
    assert load_topology(TOPOLOGIES / "multi_gps.yaml").num_global_servers == 2
