"""HFA's local-server policy and its configuration (topology file and GeoMX's MXNET_KVSTORE_* variables)."""

from __future__ import annotations

import numpy as np
import pytest

from geomx.algorithms.hfa.rules import LocalFrequencyAggregation
from geomx.config import ConfigError, HFASpec, node_config_from_env, topology_from_dict, topology_to_dict


def test_every_k2th_round_sends_the_weighted_delta():
    hfa = LocalFrequencyAggregation(k2=3, party_weight=0.25)
    sid = (4, 1)
    hfa.set_global_model(sid, np.full(3, 1.0, np.float32))
    assert hfa.after_local_round(sid, np.full(3, 5.0, np.float32)) is None
    assert hfa.after_local_round(sid, np.full(3, 5.0, np.float32)) is None
    delta = hfa.after_local_round(sid, np.full(3, 5.0, np.float32))
    np.testing.assert_array_equal(delta, np.full(3, (5.0 - 1.0) * 0.25, np.float32))
    assert hfa.rounds(sid) == 3
    assert hfa.rounds((0, 0)) == 0  # counted per (key, slice), not by key 0


def test_global_round_without_a_global_model_is_an_error():
    hfa = LocalFrequencyAggregation(k2=1, party_weight=1.0)
    with pytest.raises(RuntimeError, match="no global model for key 2 slice 0"):
        hfa.after_local_round((2, 0), np.zeros(2, np.float32))


@pytest.mark.parametrize("k2,weight", [(0, 0.5), (1, 0.0), (1, 1.5)])
def test_bad_parameters(k2, weight):
    with pytest.raises(ValueError):
        LocalFrequencyAggregation(k2=k2, party_weight=weight)


def test_topology_hfa_round_trip_and_errors():
    topology = topology_from_dict({"parties": {"dc0": 2}, "hfa": {"k1": 20, "k2": 10}})
    assert topology.hfa == HFASpec(20, 10)
    assert topology_from_dict(topology_to_dict(topology)) == topology
    with pytest.raises(ConfigError, match="HFA needs K1 >= 1"):
        topology_from_dict({"parties": {"dc0": 2}, "hfa": {"k1": 0, "k2": 10}})
    with pytest.raises(ConfigError, match=r"hfa\.k2 must be an integer"):
        topology_from_dict({"parties": {"dc0": 2}, "hfa": {"k1": 2, "k2": "ten"}})


BASE_ENV = {"GEOMX_ROLE": "local_server", "GEOMX_PARTY": "dc0", "GEOMX_SCHEDULER": "127.0.0.1:5000",
            "GEOMX_GLOBAL_SCHEDULER": "127.0.0.1:5001"}


def test_geomx_hfa_variables_are_aliases():
    config = node_config_from_env({**BASE_ENV, "MXNET_KVSTORE_USE_HFA": "1", "MXNET_KVSTORE_HFA_K1": "20",
                                   "MXNET_KVSTORE_HFA_K2": "10"})
    assert config.topology.hfa == HFASpec(20, 10)
    ours = node_config_from_env({**BASE_ENV, "GEOMX_HFA": "1", "GEOMX_HFA_K1": "5", "MXNET_KVSTORE_HFA_K1": "20"})
    assert ours.topology.hfa == HFASpec(5, 1)
    assert node_config_from_env({**BASE_ENV, "MXNET_KVSTORE_USE_HFA": "0"}).topology.hfa is None
    assert node_config_from_env(BASE_ENV).topology.hfa is None
    with pytest.raises(ConfigError, match="must be 0 or 1"):
        node_config_from_env({**BASE_ENV, "GEOMX_HFA": "maybe"})
