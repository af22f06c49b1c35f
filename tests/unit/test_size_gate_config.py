"""A negative size gate is refused where the topology is read, in one line naming the option.

Why: ``GEOMX_SIZE_LOWER_BOUND=-1`` passed ``geomx launch`` and every worker then died on its codec's refusal
with a traceback (``geomx.torch``'s ``set_gradient_compression``).
"""

from __future__ import annotations

import pytest

from geomx.config import ConfigError
from geomx.config.env import topology_from_env
from geomx.config.topology import PartySpec, Topology


def test_a_negative_size_lower_bound_is_refused_from_the_environment() -> None:
    topology = Topology(parties=(PartySpec("dc0", 1), PartySpec("dc1", 1)), central="dc0")
    with pytest.raises(ConfigError, match="size_lower_bound must be at least 0, got -1"):
        topology_from_env(topology, {"GEOMX_SIZE_LOWER_BOUND": "-1"})
    assert topology_from_env(topology, {"GEOMX_SIZE_LOWER_BOUND": "0"}).size_lower_bound == 0


def test_a_negative_size_lower_bound_is_refused_in_the_topology() -> None:
    with pytest.raises(ConfigError, match="size_lower_bound must be at least 0"):
        Topology(parties=(PartySpec("dc0", 1),), central="dc0", size_lower_bound=-5)
