"""The global scheduler dies while a party's local server waits for its registration to complete: the server
says so in one line, naming the scheduler's address and that its connection dropped, and exits at once instead of
at the register timeout (it used to wait that long, then call the dead scheduler one that "runs, handshake passed,
and waits for the job's other members").
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from typing import IO

from harness import write_topology

REGISTER_S = 30.0  # the register timeout: the server must not need it
WAIT_S = 60.0  # each wait of this test (a process's start at load average 40 on 2 cores included)


def lines_of(stream: IO[str]) -> queue.Queue[str]:
    """The lines ``stream`` prints, as they come (a reader thread)."""
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        for line in stream:
            lines.put(line)

    threading.Thread(target=read, daemon=True).start()
    return lines


def test_a_global_scheduler_gone_during_registration_is_named_at_once(tmp_path, reserved_port):
    topology = write_topology(tmp_path / "job.yaml", parties={"dc0": 1, "dc1": 1},
                              timeouts={"register": f"{REGISTER_S:g}s"})
    address = f"127.0.0.1:{reserved_port()}"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("GEOMX_", "DMLC_"))}
    base.update(GEOMX_TOPOLOGY=str(topology), GEOMX_HOST="127.0.0.1", GEOMX_GLOBAL_SCHEDULER=address,
                PYTHONUNBUFFERED="1", GEOMX_RUN_DIR=str(tmp_path / "run"))
    node = [sys.executable, "-m", "geomx.node"]
    scheduler = subprocess.Popen(node, env={**base, "GEOMX_ROLE": "global_scheduler", "GEOMX_PARTY": "dc0"},
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    # dc1's local server: it registers with the global tier first (its own scheduler is never reached)
    server = subprocess.Popen(node, env={**base, "GEOMX_ROLE": "local_server", "GEOMX_PARTY": "dc1", "GEOMX_RANK": "0",
                                         "GEOMX_SCHEDULER": f"127.0.0.1:{reserved_port()}"},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert scheduler.stderr is not None
        said = lines_of(scheduler.stderr)
        deadline = time.monotonic() + WAIT_S
        while "registered local_server of dc1" not in (line := said.get(timeout=max(0.1, deadline - time.monotonic()))):
            assert "ERROR" not in line, line
        scheduler.send_signal(signal.SIGKILL)  # the job is incomplete (no dc0): dc1's server still waits
        killed = time.monotonic()
        output = server.communicate(timeout=WAIT_S)[0]
        waited = time.monotonic() - killed
    finally:
        for proc in (scheduler, server):
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert server.returncode == 3, output
    assert "Traceback" not in output and "has not answered yet" not in output, output
    assert f"the global scheduler at {address} stopped before this node's registration completed: it was connected, " \
           "then the connection dropped; nothing listens there since (connection refused" in output, output
    assert waited < REGISTER_S / 2, (waited, output)  # named at once, not at the register timeout
