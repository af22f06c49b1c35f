"""A configuration error names the environment variable when the value came from the environment, and the YAML
key when it came from the topology file (``geomx.config.fields.named`` / ``replaced``)."""

from __future__ import annotations

import pytest

from geomx.config import ConfigError, job_training, topology_from_dict
from geomx.launch import launch
from geomx.server.compose import check_plugins

TOPOLOGY = topology_from_dict({"parties": {"dc0": 1, "dc1": 1}})


def _refusal(env: dict[str, str], topology=TOPOLOGY) -> str:
    with pytest.raises(ConfigError) as caught:
        check_plugins(job_training(topology, env), topology)
    return str(caught.value)


@pytest.mark.parametrize(("env", "text"), [
    ({"GEOMX_SYNC": "dist_foo"}, "GEOMX_SYNC='dist_foo' is unknown; valid: ['dist_async', "),
    ({"GEOMX_SERVER_OPTIMIZER": "lion"}, "GEOMX_SERVER_OPTIMIZER='lion' is unknown; valid: ['auto', "),
    ({"GEOMX_STALENES": "2"}, "GEOMX_STALENES='2': training has unknown fields ['stalenes']"),
    ({"GEOMX_BUCKET_MB": "0"}, "GEOMX_BUCKET_MB='0': training.bucket_mb must be positive"),
])
def test_a_value_from_the_environment_is_named_by_its_variable(env, text):
    assert _refusal(env).startswith(text), _refusal(env)


def test_a_value_from_the_topology_is_named_by_its_key():
    topology = topology_from_dict({"parties": {"dc0": 1}, "training": {"sync": "dist_foo", "stalenes": 2}})
    assert _refusal({}, topology).startswith("training.sync 'dist_foo' is unknown")
    fixed = topology_from_dict({"parties": {"dc0": 1}, "training": {"stalenes": 2}})
    assert _refusal({}, fixed).startswith("training has unknown fields ['stalenes']")
    # the environment's value wins, and is the one named
    assert _refusal({"GEOMX_SYNC": "dist_bar"}, topology).startswith("GEOMX_SYNC='dist_bar' is unknown")


def test_geomx_launch_names_the_variable_before_starting_anything(tmp_path, monkeypatch):
    path = tmp_path / "job.yaml"
    path.write_text("parties: {dc0: 1}\n")
    monkeypatch.setenv("GEOMX_SYNC", "dist_foo")
    with pytest.raises(ConfigError, match=r"^GEOMX_SYNC='dist_foo' is unknown"):
        launch(path, ["true"], run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()
