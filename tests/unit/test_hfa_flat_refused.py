"""HFA (and ESync, which runs on it) is refused on a flat parameter server, where no local server averages a party.

Why: under ``mode: flat`` every worker pushed ``param / its party's workers`` straight to the global server, which
summed them over every worker: the model grew each global round (``examples/cnn_hfa.py`` on topologies/flat.yaml
with ``GEOMX_HFA=1``: loss 1.2e6 after one epoch, no error).
"""

from __future__ import annotations

import pytest

from geomx.config import ConfigError
from geomx.config.env import topology_from_env
from geomx.config.yaml_io import topology_from_dict

FLAT = {"parties": {"dc0": 2, "dc1": 2}, "central": "dc0", "mode": "flat"}


def test_hfa_in_a_flat_topology_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"HFA \(and ESync\) does not combine with a flat parameter server"):
        topology_from_dict({**FLAT, "hfa": {"k1": 4, "k2": 1}})
    topology_from_dict({**FLAT, "mode": "hips", "hfa": {"k1": 4, "k2": 1}})  # HiPS: as before


def test_hfa_turned_on_by_the_environment_over_a_flat_topology_is_refused() -> None:
    with pytest.raises(ConfigError, match="flat parameter server"):
        topology_from_env(topology_from_dict(FLAT), {"GEOMX_HFA": "1", "GEOMX_HFA_K1": "2"})
