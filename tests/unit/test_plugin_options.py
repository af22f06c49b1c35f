"""Plug-in options: collected by the config model without knowing them, handed by the composition root to the
plug-in that declares them, refused (before any process starts) when no plug-in does."""

from __future__ import annotations

import re
from collections.abc import Collection
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

import geomx.config
import geomx.server.compose
from geomx.config import (
    ConfigError,
    NodeConfig,
    Role,
    TrainingSpec,
    node_config_from_env,
    node_env,
    topology_from_dict,
    topology_to_dict,
)
from geomx.config.env import known_variables
from geomx.core.options import parse_value
from geomx.core.policy import SyncPolicy
from geomx.launch import launch
from geomx.server.compose import build_policy, check_plugins

BASE_ENV = {"GEOMX_ROLE": "worker", "GEOMX_PARTY": "dc0", "GEOMX_GLOBAL_SCHEDULER": "127.0.0.1:1",
            "GEOMX_SCHEDULER": "127.0.0.1:2", "GEOMX_NUM_WORKERS": "1"}


class Patient(SyncPolicy):
    """A policy with options, as a plug-in would declare them."""

    name = "dist_patient"
    options: ClassVar[dict[str, type]] = {"patience": int, "polite": bool}

    def __init__(self, patience: int = 1, polite: bool = False) -> None:
        if patience < 0:
            raise ValueError(f"patience must be >= 0, got {patience}")
        self.patience, self.polite = patience, polite

    def round_complete(self, contributors: Collection[str], awaited: Collection[str]) -> bool:
        return True

    def rescale(self, total: np.ndarray, present: int, full: int) -> np.ndarray:
        return total


@pytest.fixture
def with_patient(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(geomx.server.compose.SYNC_POLICIES, Patient.name, Patient)


def test_unknown_training_keys_and_variables_are_collected_as_text_and_written_back() -> None:
    topology = topology_from_dict({"parties": {"dc0": 1}, "training": {"patience": 3, "polite": True}})
    assert topology.training.plugin_options == (("patience", "3"), ("polite", "true"))
    assert topology_from_dict(topology_to_dict(topology)) == topology
    node = node_config_from_env({**BASE_ENV, "GEOMX_PATIENCE": "5", "GEOMX_SYNC": "dist_patient"})
    assert node.topology.training.plugin_options == (("patience", "5"),)  # GEOMX_NUM_WORKERS etc. are not
    assert node.topology.training.sync == "dist_patient"
    config = NodeConfig(role=Role.WORKER, party="dc0", topology=topology, global_scheduler="127.0.0.1:1")
    env = node_env(config, Path("t.yaml"))
    assert env["GEOMX_PATIENCE"] == "3" and env["GEOMX_POLITE"] == "true"
    with pytest.raises(ConfigError, match=r"training has an unknown field 'colour' \(not a plug-in option either"):
        topology_from_dict({"parties": {"dc0": 1}, "training": {"colour": [1, 2]}})


def test_known_variables_are_every_variable_the_config_package_reads() -> None:
    # a GEOMX_* name the config reads but does not count as known would turn into a plug-in option
    source = "".join(path.read_text() for path in Path(geomx.config.__file__).parent.glob("*.py"))
    read = set(re.findall(r'"(GEOMX_[A-Z0-9_]+)"', source))
    assert read == known_variables()


def test_a_policy_gets_the_options_it_declares_parsed(with_patient: Any) -> None:
    policy = build_policy("dist_patient", {"patience": "4", "polite": "yes", "other": "x"})
    assert isinstance(policy, Patient) and policy.patience == 4 and policy.polite is True
    assert build_policy("dist_patient", {}).patience == 1  # the constructor's default
    with pytest.raises(ConfigError, match="option 'patience' of dist_patient must be an integer, got 'lots'"):
        build_policy("dist_patient", {"patience": "lots"})
    with pytest.raises(ConfigError, match="dist_patient: patience must be >= 0, got -1"):
        build_policy("dist_patient", {"patience": "-1"})
    assert parse_value("p", "x", float, "0.5") == 0.5 and parse_value("p", "x", str, "a") == "a"


def test_an_option_no_plug_in_takes_is_refused_naming_it_and_what_the_plug_ins_take(with_patient: Any) -> None:
    check_plugins(TrainingSpec(plugin_options=(("patience", "2"),)))
    with pytest.raises(ConfigError) as refused:
        check_plugins(TrainingSpec(plugin_options=(("patience", "2"), ("stalenes", "2"))))
    text = str(refused.value)
    assert "unknown fields ['stalenes']" in text and "dist_patient takes patience (int), polite (bool)" in text
    with pytest.raises(ConfigError, match="must be an integer"):  # a value its plug-in cannot read
        check_plugins(TrainingSpec(plugin_options=(("patience", "x"),)))
    with pytest.raises(ConfigError, match=r"training.sync 'dist_nope' is unknown; valid: .*dist_patient"):
        check_plugins(TrainingSpec(sync="dist_nope"))


def test_launch_refuses_a_bad_option_before_starting_any_process(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "t.yaml"
    path.write_text("parties:\n  dc0: {workers: 1}\n")
    monkeypatch.setenv("GEOMX_STALENES", "2")
    run_dir = tmp_path / "run"
    with pytest.raises(ConfigError, match=r"unknown fields \['stalenes'\]"):
        launch(path, ["python", "-c", "pass"], run_dir=run_dir)
    assert not run_dir.exists()
