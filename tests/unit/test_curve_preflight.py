"""A CURVE key file a job needs and cannot read is refused before anything starts (``transport.security.check_keys``,
called by ``geomx launch`` and ``geomx.node``): one error naming the file and its party. Each used to start every
process, and every one of them printed a SecurityError traceback.

``launch`` here never starts a process: ``Launcher.run`` is replaced by one that fails the test.
"""

from __future__ import annotations

import io
import logging
import os
import shutil
from pathlib import Path

import pytest
import yaml

from geomx import launch as launch_module
from geomx import node as node_module
from geomx.config import job_topology
from geomx.launch import launch
from geomx.transport.security import SecurityError, check_keys, generate_keys


class Started(Exception):
    """The job would have started (the key check let it through)."""


@pytest.fixture(autouse=True)
def never_started(monkeypatch):
    """``Launcher.run`` raises Started; and a clean environment (no GEOMX_* of the caller's)."""
    def started(self):
        raise Started([spec.label for spec in self.specs])

    monkeypatch.setattr(launch_module.Launcher, "run", started)
    for name in list(os.environ):
        if name.startswith(("GEOMX_", "DMLC_", "MXNET_")):
            monkeypatch.delenv(name)


@pytest.fixture
def job(tmp_path: Path) -> Path:
    """A two-party job (dc0 central) whose keys, made by ``generate_keys``, sit in ``keys/`` beside it."""
    generate_keys(tmp_path / "keys", ["dc0", "dc1"])
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({"parties": {"dc0": 1, "dc1": 1}, "central": "dc0",
                                    "security": {"curve_keys": "keys"}}))
    return path


def _check(job: Path, parties: list[str]) -> None:
    check_keys(job_topology(job, {}), parties)


def test_a_complete_key_folder_passes_and_no_curve_checks_nothing(job: Path, tmp_path: Path):
    _check(job, ["dc0", "dc1"])
    plain = tmp_path / "plain.yaml"
    plain.write_text(yaml.safe_dump({"parties": {"dc0": 1}, "central": "dc0"}))
    _check(plain, ["dc0"])


def test_each_missing_or_bad_key_file_is_named_with_its_party(job: Path):
    keys = job.parent / "keys"
    (keys / "dc1.key_secret").unlink()
    with pytest.raises(SecurityError, match=r"party 'dc1' has no secret key .*keys/dc1\.key_secret"):
        _check(job, ["dc1"])
    _check(job, ["dc0"])  # a host of dc0 needs no secret of dc1's
    shutil.copy(keys / "dc1.key", keys / "dc1.key_secret")  # a public key where the secret one belongs
    with pytest.raises(SecurityError, match=r"party 'dc1'.s secret key file .*dc1\.key_secret holds no secret key"):
        _check(job, ["dc1"])
    (keys / "dc1.key").unlink()  # every host needs every party's public key: dc0's servers admit dc1 by it
    with pytest.raises(SecurityError, match=r"party 'dc1' has no public key .*keys/dc1\.key;"):
        _check(job, ["dc0"])
    (keys / "dc1.key").write_text('public-key = "tooshort"\n')
    with pytest.raises(SecurityError, match=r"party 'dc1'.s public key .*dc1\.key is malformed"):
        _check(job, ["dc0"])
    (keys / "dc1.key").write_text("garbage\n")
    with pytest.raises(SecurityError, match=r"cannot read party 'dc1'.s public key .*dc1\.key: No public key"):
        _check(job, ["dc0"])
    shutil.rmtree(keys)
    with pytest.raises(SecurityError, match=r"CURVE key folder .*keys does not exist"):
        _check(job, ["dc0"])


def test_launch_refuses_a_missing_secret_key_before_any_process(job: Path, tmp_path: Path):
    (tmp_path / "keys" / "dc1.key_secret").unlink()
    run_dir = tmp_path / "run"
    with pytest.raises(ValueError, match=r"party 'dc1' has no secret key .*dc1\.key_secret") as refused:
        launch(job, ["true"], run_dir=run_dir, out=io.StringIO())
    assert isinstance(refused.value, SecurityError)  # `geomx launch` prints ValueErrors as one line, exit 2
    assert not run_dir.exists()


def test_launch_of_one_party_needs_that_partys_secret_only(job: Path, tmp_path: Path):
    """A party's host holds its own secret key, not the central party's: ``--party dc1`` starts."""
    (tmp_path / "keys" / "dc0.key_secret").unlink()
    with pytest.raises(Started):
        launch(job, ["true"], run_dir=tmp_path / "run", out=io.StringIO(), party="dc1",
               global_scheduler="127.0.0.1:1")
    with pytest.raises(SecurityError, match=r"party 'dc0' has no secret key"):
        launch(job, [], run_dir=tmp_path / "run0", out=io.StringIO(), global_only=True)


@pytest.mark.parametrize("removed, said", [
    ("dc0.key_secret", "party 'dc0' has no secret key {}; this host needs it (from `geomx keygen`)"),
    ("dc1.key", "party 'dc1' has no public key {}; every host needs every party's .key file (from `geomx keygen`)"),
], ids=["own secret key", "a peer's public key"])
def test_a_node_started_by_hand_names_a_missing_key_in_one_line(job: Path, tmp_path: Path, monkeypatch, caplog,
                                                                removed: str, said: str):
    """Its van's Guard reads its own secret key and every party's public key before the scheduler binds or connects
    to anything: a peer's missing one was a traceback on the I/O thread when it first connected to that party."""
    (tmp_path / "keys" / removed).unlink()
    for name, value in {"GEOMX_ROLE": "global_scheduler", "GEOMX_PARTY": "dc0", "GEOMX_TOPOLOGY": str(job),
                        "GEOMX_GLOBAL_SCHEDULER": "127.0.0.1:1"}.items():
        monkeypatch.setenv(name, value)
    with caplog.at_level(logging.ERROR):
        assert node_module._configured_node() == 2
    missing = tmp_path / "keys" / removed
    assert [r.getMessage() for r in caplog.records] == [f"configuration error: {said.format(missing)}"]
