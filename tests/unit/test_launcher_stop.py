"""How the launcher stops a job: a process that is stopped (SIGSTOP: a debugger's, a frozen host's, the heartbeat
tests') when another fails ends by SIGTERM at once, woken by the SIGCONT that follows it, instead of holding the
signal pending until the SIGKILL after the grace period; a stop reaches grandchildren that left the process group;
and a signal to a command that runs several jobs stops the command, not only its job in flight (issue 46)."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from geomx.cluster.processes import StopOnSignals
from geomx.launch import Launcher, LaunchInterrupted, ProcessSpec

# writes its pid where the other process looks, then stops itself
FROZEN = """
import os, signal, sys
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
os.kill(os.getpid(), signal.SIGSTOP)
"""

# fails (exit code 3) once the other process is stopped: its state in /proc is "T"
FAILING = """
import pathlib, sys, time
marker = pathlib.Path(sys.argv[1])
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    if marker.exists():
        stat = pathlib.Path(f"/proc/{marker.read_text()}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "T":
            sys.exit(3)
    time.sleep(0.01)
sys.exit(4)
"""


def test_a_stopped_process_ends_by_sigterm_when_the_job_stops(tmp_path):
    marker = tmp_path / "frozen.pid"
    specs = [ProcessSpec("frozen", [sys.executable, "-c", FROZEN, str(marker)], {}, is_worker=True),
             ProcessSpec("failing", [sys.executable, "-c", FAILING, str(marker)], {}, is_worker=True)]
    out = io.StringIO()
    result = Launcher(specs, tmp_path / "run", out=out).run()
    assert result.failed == "failing" and result.exit_codes["failing"] == 3, (result, out.getvalue())
    # without the SIGCONT: -9, the SIGKILL that follows SIGTERM after 5 s
    assert result.exit_codes["frozen"] == -signal.SIGTERM, (result.exit_codes, out.getvalue())


# starts a grandchild in a session of its own (as torchrun does its ranks), writes its pid, then waits to be stopped
SPAWNING = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(child.pid))
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(600)
"""


def _wait_for(path, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)
    return int(path.read_text())


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def test_stopping_a_job_ends_grandchildren_in_sessions_of_their_own(tmp_path):
    marker = tmp_path / "grandchild.pid"
    launcher = Launcher([ProcessSpec("spawner", [sys.executable, "-c", SPAWNING, str(marker)], {}, is_worker=True)],
                        tmp_path / "run", out=io.StringIO())
    stopper = threading.Thread(target=lambda: (_wait_for(marker), launcher.stop()))
    stopper.start()
    started = time.monotonic()
    result = launcher.run()
    stopper.join()
    grandchild = int(marker.read_text())
    try:
        assert result.exit_code == 130 and time.monotonic() - started < 30
        # out of reach of the spawner's process group: without the launcher's snapshot of the tree it lives on
        assert _gone(grandchild), f"grandchild {grandchild} outlived the job"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(grandchild, signal.SIGKILL)


def test_a_signal_stops_the_job_then_the_command_that_ran_it(tmp_path):
    """SIGTERM while a job runs under StopOnSignals (geomx bench): the job stops, then KeyboardInterrupt reaches
    the command instead of its next job (it used to go on with the next row)."""
    marker = tmp_path / "grandchild.pid"
    launcher = Launcher([ProcessSpec("spawner", [sys.executable, "-c", SPAWNING, str(marker)], {}, is_worker=True)],
                        tmp_path / "run", out=io.StringIO())
    sender = threading.Thread(target=lambda: (_wait_for(marker), os.kill(os.getpid(), signal.SIGTERM)))
    reached = None
    with StopOnSignals() as stop:
        sender.start()
        try:
            launcher.run()
        except KeyboardInterrupt:
            reached = "command"
    sender.join()
    grandchild = int(marker.read_text())
    assert reached == "command" and stop.signum == signal.SIGTERM
    assert all(_gone(pid) for pid in [*launcher.pids().values(), grandchild])
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handlers are given back


@pytest.mark.parametrize(("sig", "default"), [(signal.SIGINT, signal.default_int_handler),
                                              (signal.SIGTERM, signal.SIG_DFL)], ids=["SIGINT", "SIGTERM"])
def test_a_signal_reaches_a_library_caller_of_the_launcher_once_its_job_is_stopped(tmp_path, sig, default):
    """A caller with Python's own handlers (a script calling ``launch()``, a test runner): the signal stops the job,
    then reaches the caller as ``LaunchInterrupted`` (a KeyboardInterrupt carrying the job's result) instead of
    being swallowed, so a Ctrl-C'd loop of jobs ends instead of starting its next one."""
    marker = tmp_path / "grandchild.pid"
    launcher = Launcher([ProcessSpec("spawner", [sys.executable, "-c", SPAWNING, str(marker)], {}, is_worker=True)],
                        tmp_path / "run", out=io.StringIO())
    sender = threading.Thread(target=lambda: (_wait_for(marker), os.kill(os.getpid(), sig)))
    previous = signal.signal(sig, default)
    try:
        sender.start()
        with pytest.raises(LaunchInterrupted) as stopped:
            launcher.run()
        assert signal.getsignal(sig) is default  # given back before the raise
    finally:
        sender.join()
        signal.signal(sig, previous)  # the test runner's own (xdist's workers ignore SIGINT)
    grandchild = int(marker.read_text())
    assert stopped.value.signum == sig and stopped.value.result.exit_code == 130
    assert all(_gone(pid) for pid in [*launcher.pids().values(), grandchild])


# a launcher (its own process) whose one job process writes its pid and waits to be stopped
LAUNCHER = """
import io, pathlib, sys
from geomx.launch import LaunchInterrupted, Launcher, ProcessSpec
child = ("import os, sys, time; open(sys.argv[1] + '.tmp', 'w').write(str(os.getpid())); "
         "os.replace(sys.argv[1] + '.tmp', sys.argv[1]); time.sleep(600)")
spec = ProcessSpec("sleeper", [sys.executable, "-c", child, sys.argv[1]], {}, is_worker=True)
Launcher([spec], pathlib.Path(sys.argv[2]), out=io.StringIO()).run()
"""


def test_a_launcher_killed_by_sigkill_leaves_no_process_behind(tmp_path):
    """SIGKILL reaches no handler: its processes, each in a session of its own, get SIGTERM from the kernel."""
    marker = tmp_path / "child.pid"
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(marker), str(tmp_path / "run")])
    try:
        child = _wait_for(marker)
        launcher.kill()
        launcher.wait(timeout=30)
        deadline = time.monotonic() + 10
        while not _gone(child) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _gone(child), f"the launcher's process {child} outlived it"
    finally:
        if launcher.poll() is None:
            launcher.kill()
        if marker.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(marker.read_text()), signal.SIGKILL)
