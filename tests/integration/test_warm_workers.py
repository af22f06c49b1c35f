"""The warm-worker stub stands for its worker (``warm_workers.py``): the launcher sees the worker's exit code or
signal, its signals reach the worker, and a stub killed takes its worker with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from harness import WARM_WORKERS_VARIABLE, worker_command

SCRIPT = """
import os, signal, sys, time
from pathlib import Path
marker = Path(sys.argv[1])
mode = sys.argv[2]
signal.signal(signal.SIGTERM, lambda *_: (marker.with_suffix(".term").write_text("got"), sys.exit(7)))
marker.with_suffix(".part").write_text(f"{os.getpid()} {os.getcwd()} {os.environ.get('WARM_TEST_VALUE')} {sys.argv[0]}")
os.replace(marker.with_suffix(".part"), marker)  # whole or absent: a reader never sees it half written
if mode == "exit":
    sys.exit(3)
if mode == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(120)
"""


def _wait_for(path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def _start(tmp_path, mode: str) -> tuple[subprocess.Popen, object]:
    assert os.environ.get(WARM_WORKERS_VARIABLE), "this module runs with warm workers"
    script = tmp_path / "worker.py"
    script.write_text(SCRIPT)
    marker = tmp_path / "marker"
    command = worker_command(script, str(marker), mode)
    assert command[1].endswith("warm_stub.py")
    proc = subprocess.Popen(command, cwd=tmp_path, env={**os.environ, "WARM_TEST_VALUE": "seen"},
                            start_new_session=True)
    return proc, marker


@pytest.mark.parametrize(("mode", "code"), [("exit", 3), ("kill", -signal.SIGKILL)])
def test_the_stub_ends_as_its_worker_did_in_the_stubs_folder_and_environment(tmp_path, mode, code):
    proc, marker = _start(tmp_path, mode)
    assert proc.wait(timeout=60) == code
    pid, cwd, value, argv0 = marker.read_text().split()
    assert int(pid) != proc.pid and cwd == str(tmp_path) and value == "seen" and argv0.endswith("worker.py")


def test_a_signal_to_the_stub_reaches_the_worker(tmp_path):
    proc, marker = _start(tmp_path, "wait")
    _wait_for(marker)
    os.killpg(proc.pid, signal.SIGTERM)  # as the launcher stops a job
    assert proc.wait(timeout=60) == 7
    assert marker.with_suffix(".term").read_text() == "got"


def test_a_stub_killed_takes_its_worker_with_it(tmp_path):
    proc, marker = _start(tmp_path, "wait")
    _wait_for(marker)
    worker = int(marker.read_text().split()[0])
    proc.kill()
    proc.wait(timeout=60)
    deadline = time.monotonic() + 30
    while os.path.exists(f"/proc/{worker}") and "Z" not in _state(worker):
        assert time.monotonic() < deadline, f"worker {worker} outlived its stub"
        time.sleep(0.05)


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


if sys.platform != "linux":  # pragma: no cover
    pytestmark = pytest.mark.skip(reason="warm workers use Linux's prctl and /proc")
