"""How the launcher stops a job: a process that is stopped (SIGSTOP: a debugger's, a frozen host's, the heartbeat
tests') when another fails ends by SIGTERM at once, woken by the SIGCONT that follows it, instead of holding the
signal pending until the SIGKILL after the grace period."""

from __future__ import annotations

import io
import signal
import sys

from geomx.launch import Launcher, ProcessSpec

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
