"""What `geomx launch` refuses before it starts any process (geomx.config.preflight, geomx.launch.launch): a
combination no worker could run, a bad value in the environment any process would refuse, ``--resume`` with no
checkpoint folder, a worker command that cannot be run, a ``--global-scheduler`` that is not HOST:PORT. Each used to
start the job (or crash the launcher) and fail it later, once per process.

``launch`` here never starts a process: ``Launcher.run`` is replaced by one that fails the test.
"""

from __future__ import annotations

import io
import os
import sys
import time
from pathlib import Path

import pytest
import yaml

from geomx import launch as launch_module
from geomx.config import ConfigError, job_topology, node_config_from_env
from geomx.config.combinations import check_training
from geomx.config.env import check_address
from geomx.config.preflight import check_command, check_processes
from geomx.launch import Launcher, ProcessSpec, launch

HFA = {"hfa": {"k1": 4, "k2": 5}}
PLAIN: dict[str, object] = {}


@pytest.fixture(autouse=True)
def never_started(monkeypatch):
    """Fail the test if the job would start; and a clean environment (no GEOMX_* of the caller's)."""
    def started(self):
        raise AssertionError(f"the job was started: {[spec.label for spec in self.specs]}")

    monkeypatch.setattr(launch_module.Launcher, "run", started)
    for name in list(os.environ):
        if name.startswith(("GEOMX_", "DMLC_", "MXNET_")):
            monkeypatch.delenv(name)


def _topology(tmp_path: Path, **blocks: object) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({"parties": {"dc0": 2, "dc1": 2}, "central": "dc0", **blocks}))
    return path


def _refused(tmp_path: Path, blocks: dict, env: dict[str, str], monkeypatch, command=("true",), **options) -> str:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    run_dir = tmp_path / "run"
    with pytest.raises(ConfigError) as refused:
        launch(_topology(tmp_path, **blocks), list(command), run_dir=run_dir, out=io.StringIO(), **options)
    assert not run_dir.exists()  # nothing was started, nothing written
    return str(refused.value)


# bug 1: every row of the torch wrapper's plan that needs no torch optimizer
@pytest.mark.parametrize(("blocks", "env", "text"), [
    (HFA, {"GEOMX_SYNC": "dist_async"},
     "HFA and ESync average models synchronously: training.sync dist_async is not; use one of ['dist_sync']"),
    ({**HFA, "training": {"sync": "dist_ssp"}}, {}, "training.sync dist_ssp is not"),
    (PLAIN, {"GEOMX_ESYNC": "1"}, "ESync runs on HFA with K2 = 1: add `hfa: {k1: 4, k2: 1}` to the topology"),
    (HFA, {"GEOMX_ESYNC": "1"}, "ESync runs on HFA with K2 = 1"),  # K2 = 5
    (HFA, {"GEOMX_SERVER_OPTIMIZER": "adam"}, "under HFA the global server sees model deltas: server optimizer 'adam'"),
    ({"training": {"server_optimizer": "outer_nesterov"}}, {}, "the outer Nesterov optimizer needs HFA"),
    (PLAIN, {"GEOMX_HFA": "1", "GEOMX_SYNC": "dist_async"}, "HFA and ESync average models synchronously"),
])
def test_a_combination_no_worker_could_run_is_refused_before_any_process(tmp_path, monkeypatch, blocks, env, text):
    assert text in _refused(tmp_path, blocks, env, monkeypatch)


def test_the_launch_check_and_the_plan_share_the_rows(tmp_path):
    """The same function checks at launch and in make_plan; a job the plan takes passes at launch."""
    topology = job_topology(_topology(tmp_path, **HFA), {"GEOMX_HFA_K2": "1", "GEOMX_ESYNC": "1"})
    facts = check_training(topology.training, topology.hfa, synchronous=["dist_sync"], applies_on_server=False)
    assert facts["esync"] and facts["hfa"] and not facts["no_hfa_k2_1"]
    with pytest.raises(ConfigError, match="ESync runs on HFA with K2 = 1"):
        check_training(topology.training, None, synchronous=["dist_sync"], applies_on_server=False)


# bug 2: a bad value from the environment, in any block a process reads
@pytest.mark.parametrize(("blocks", "env", "text"), [
    (HFA, {"GEOMX_HFA_K1": "abc"}, "GEOMX_HFA_K1 must be an integer, got 'abc'"),
    (HFA, {"GEOMX_HFA_K1": "0"}, "GEOMX_HFA_K1='0': HFA needs K1 >= 1 and K2 >= 1, got K1=0, K2=5"),
    (PLAIN, {"GEOMX_TIMEOUT": "abc"}, "GEOMX_TIMEOUT: cannot read duration 'abc'"),
    (PLAIN, {"GEOMX_DGT": "1", "GEOMX_DGT_CHANNELS": "x"}, "GEOMX_DGT_CHANNELS must be an integer, got 'x'"),
    (HFA, {"GEOMX_INTER_TS": "1"}, "TSEngine (ENABLE_INTER_TS) does not combine with HFA"),
    (PLAIN, {"GEOMX_CHECKPOINT_EVERY_STEPS": "-1"}, "GEOMX_CHECKPOINT_EVERY_STEPS='-1': checkpoint needs"),
    (PLAIN, {"GEOMX_WORKER_OFFSET": "x"}, "GEOMX_WORKER_OFFSET must be an integer, got 'x'"),  # a process's own
])
def test_a_bad_value_in_the_environment_is_refused_before_any_process(tmp_path, monkeypatch, blocks, env, text):
    assert text in _refused(tmp_path, blocks, env, monkeypatch)


def test_the_launcher_sees_the_topology_every_process_builds(tmp_path):
    """One function applies the environment for the launcher and for every process: what one checks, the other
    runs (the job's start aside, which the launcher sets)."""
    path = _topology(tmp_path, **HFA)
    env = {"GEOMX_HFA_K1": "3", "GEOMX_TIMEOUT": "7s", "GEOMX_LAN": "server", "GEOMX_ELASTIC": "1",
           "GEOMX_CHECKPOINT_DIR": str(tmp_path / "ckpt"), "GEOMX_CHECKPOINT_EVERY_STEPS": "5", "GEOMX_P3": "1",
           "GEOMX_STALENESS": "2"}
    node = node_config_from_env({**env, "GEOMX_ROLE": "global_server", "GEOMX_PARTY": "dc0",
                                 "GEOMX_TOPOLOGY": str(path), "GEOMX_GLOBAL_SCHEDULER": "127.0.0.1:9"})
    launcher = job_topology(path, env)
    assert launcher == node.topology
    assert launcher.hfa is not None and launcher.hfa.k1 == 3 and launcher.timeouts.register_s == 7.0
    assert launcher.checkpoint.every_steps == 5 and launcher.training.p3


def test_check_processes_builds_every_process_as_it_will(tmp_path):
    path = _topology(tmp_path)
    env = {"GEOMX_ROLE": "worker", "GEOMX_PARTY": "dc1", "GEOMX_TOPOLOGY": str(path),
           "GEOMX_GLOBAL_SCHEDULER": "127.0.0.1:9", "GEOMX_SCHEDULER": "127.0.0.1:10"}
    check_processes([env])
    with pytest.raises(ConfigError, match="GEOMX_PARTY='dc9' is not a party"):
        check_processes([env, {**env, "GEOMX_PARTY": "dc9"}])


# bug 3
def test_resume_without_a_checkpoint_folder_is_refused_before_any_process(tmp_path, monkeypatch):
    text = _refused(tmp_path, PLAIN, {}, monkeypatch, resume=True)
    assert text.startswith("--resume needs a checkpoint folder"), text
    assert "checkpoint.dir" in text and "GEOMX_CHECKPOINT_DIR" in text


def test_resume_with_a_checkpoint_folder_from_the_environment_gets_past_the_checks(tmp_path, monkeypatch):
    monkeypatch.setenv("GEOMX_CHECKPOINT_DIR", str(tmp_path / "ckpt"))
    monkeypatch.setenv("GEOMX_CHECKPOINT_EVERY_STEPS", "5")
    with pytest.raises(AssertionError, match="the job was started"):
        launch(_topology(tmp_path), ["true"], run_dir=tmp_path / "run", out=io.StringIO(), resume=True)


# bug 4
@pytest.mark.parametrize(("program", "why"), [
    ("/nonexistent/python", "no such file"),
    ("geomx-no-such-program", "no program of that name on PATH"),
])
def test_a_worker_command_that_cannot_be_run_is_refused_before_any_process(tmp_path, monkeypatch, program, why):
    text = _refused(tmp_path, PLAIN, {}, monkeypatch, command=(program, "train.py"))
    assert text == f"the worker command {program!r} cannot be run: {why}", text


def test_check_command_looks_where_the_workers_will(tmp_path):
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/sh\n")
    with pytest.raises(ConfigError, match="not an executable file"):
        check_command([str(script)], {"PATH": os.defpath})
    script.chmod(0o755)
    check_command([str(script)], {"PATH": os.defpath})
    check_command(["train.sh"], {"PATH": str(tmp_path)})  # on the workers' PATH
    with pytest.raises(ConfigError, match="no program of that name on PATH"):
        check_command(["train.sh"], {"PATH": os.defpath})
    check_command([sys.executable, "-c", "pass"], {})


def test_global_only_needs_no_worker_command(tmp_path, monkeypatch):
    with pytest.raises(AssertionError, match="the job was started"):
        launch(_topology(tmp_path), ["/nonexistent/python"], run_dir=tmp_path / "run", out=io.StringIO(),
               global_only=True)


def test_a_program_that_cannot_start_is_named_and_the_started_processes_stopped(tmp_path, monkeypatch):
    """A program gone between the check and the start: one error naming it, the processes already started ended."""
    monkeypatch.undo()  # the real Launcher.run
    specs = [ProcessSpec("dc0/server", [sys.executable, "-c", "import time; time.sleep(60)"], {}, is_worker=False),
             ProcessSpec("dc0/worker0", ["/nonexistent/python", "train.py"], {}, is_worker=True)]
    launcher = Launcher(specs, tmp_path / "run", out=io.StringIO())
    started = time.monotonic()
    with pytest.raises(ConfigError, match=r"^dc0/worker0 cannot start '/nonexistent/python': No such file"):
        launcher.run()
    assert [spec.label for spec, _ in launcher._procs] == ["dc0/server"]
    assert all(proc.poll() is not None for _, proc in launcher._procs)  # stopped, not left sleeping
    assert time.monotonic() - started < 30


# bug 5
@pytest.mark.parametrize("address", ["notanaddress", "127.0.0.1", "host:port", "127.0.0.1:70000", "a b:9"])
def test_a_global_scheduler_that_is_not_host_port_is_named(tmp_path, monkeypatch, address):
    text = _refused(tmp_path, PLAIN, {}, monkeypatch, global_only=True, global_scheduler=address)
    assert text == f"--global-scheduler {address!r} must be HOST:PORT with a numeric port (0-65535)", text
    party = _refused(tmp_path, PLAIN, {}, monkeypatch, party="dc1", global_scheduler=address)
    assert party == text


def test_check_address_takes_host_port():
    assert check_address("10.0.0.1:9000", "x") == "10.0.0.1:9000"
    assert check_address("dc0.example:0", "x") == "dc0.example:0"
