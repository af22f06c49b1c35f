"""Numbers written with an exponent and no dot (``3e-3``) are numbers, in a topology file and in a variable.

Why: PyYAML reads YAML 1.1, whose float needs a dot, so docs/algorithms.md's own
``server_optimizer: {type: dcadam, lr: 3e-3}`` was refused ("parameter lr='3e-3' must be a number"), and so were
``GEOMX_SERVER_OPTIMIZER=dcadam:lr=3e-3`` and ``GEOMX_COMPRESSION=bsc:threshold=1e-3``.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from geomx.config.env import topology_from_env
from geomx.config.yaml_io import load_topology


def test_a_topology_file_reads_exponents_as_numbers(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text("parties: {dc0: 1, dc1: 1}\n"
                    "training: {sync: dist_async, server_optimizer: {type: dcadam, lr: 3e-3},\n"
                    "           compression: {type: fp16}}\n"
                    "size_lower_bound: 1_000\n")
    training = load_topology(path).training
    assert dict(training.server_optimizer_params) == {"lr": 0.003}
    assert yaml.safe_load("3e-3") == "3e-3"  # the plain safe loader is left as it is


def test_a_variable_reads_exponents_as_numbers(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text("parties: {dc0: 1, dc1: 1}\n")
    topology = topology_from_env(load_topology(path), {"GEOMX_SERVER_OPTIMIZER": "dcadam:lr=3e-3",
                                                      "GEOMX_SYNC": "dist_async",
                                                      "GEOMX_COMPRESSION": "bsc:threshold=1e-3"})
    assert dict(topology.training.server_optimizer_params) == {"lr": 0.003}
    assert topology.training.compression == {"type": "bsc", "threshold": 0.001}
