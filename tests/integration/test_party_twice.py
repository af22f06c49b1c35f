"""A party started twice: `geomx launch JOB --party dc1 --global-scheduler ADDR -- CMD` run again while dc1 trains.

The global scheduler keeps the running party and refuses the second one within a few heartbeat intervals, as soon as
the first one's heartbeats show it still runs: the duplicate's local server (a `lan: server` party) says in one line
that the party is already registered, and so does the refusal its ranks raise from `geomx.kv.create` (a
`lan: collective` party, whose ranks register with the global scheduler themselves). Both used to wait twice the
heartbeat timeout (or the whole register timeout, whichever came first) and then print a traceback; the heartbeat
timeout here is long (30 s) so that such a wait shows. The first job trains on and ends normally.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from harness import Job, run_job, worker_command, write_topology

WAIT_S = 90.0  # each wait of this test, a job's start at load average 40 on 2 cores included
# the duplicate's whole launch, its start included; without the refusal it would last 60 s (twice the heartbeat
# timeout, and the register timeout)
PROMPT_S = 45.0

HOLD = '''
import os
import sys
import time
from pathlib import Path

import geomx

kv = geomx.kv.create("dist_sync")
Path(os.environ["GEOMX_RUN_DIR"], "joined-" + kv.name.replace("/", "-")).write_text("")
stop, deadline = Path(sys.argv[1]), time.monotonic() + float(sys.argv[2])
while not stop.exists() and time.monotonic() < deadline:
    time.sleep(0.05)
kv.close()
sys.exit(0 if stop.exists() else 5)
'''


def first_job(tmp_path: Path, topology: Path, address: str, script: Path, stop: Path) -> tuple[threading.Thread, dict]:
    """The whole job (dc0 and dc1) in a thread, its workers holding until ``stop`` exists; returns once every worker
    joined."""
    jobs: dict[str, Job | BaseException] = {}

    def run() -> None:
        try:
            jobs["first"] = run_job(tmp_path, script, str(stop), str(WAIT_S * 3), name="first",
                                    global_scheduler=address, topology=topology)
        except BaseException as exc:
            jobs["first"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    run_dir = tmp_path / "run-first"
    deadline = time.monotonic() + WAIT_S
    try:
        while len(list(run_dir.glob("joined-*"))) < 2:  # dc0/worker0 and dc1/worker0
            assert thread.is_alive(), jobs
            assert time.monotonic() < deadline, "the first job's workers did not join"
            thread.join(timeout=0.2)
    except BaseException:
        stop.write_text("")  # the job ends now, not at its workers' own deadline
        thread.join(timeout=WAIT_S)
        raise
    return thread, jobs


def start_twice(tmp_path: Path, address: str, lan: str) -> tuple[subprocess.CompletedProcess[str], float, Job]:
    """Run the job, then launch dc1 again as a user would; returns the duplicate's launch and wall time, and the
    first job (stopped once the duplicate ended)."""
    topology = write_topology(tmp_path / "job.yaml", parties={"dc0": 1, "dc1": 1},
                              lan={"dc0": "collective", "dc1": lan},  # dc0 collective: fewer processes to start
                              timeouts={"register": "60s", "heartbeat": "30s", "shutdown": "15s"})
    script = tmp_path / "hold.py"
    script.write_text(HOLD)
    stop = tmp_path / "stop"
    thread, jobs = first_job(tmp_path, topology, address, script, stop)
    worker = worker_command(script, str(tmp_path / "never"), str(WAIT_S))  # never stopped: refused, or a hang
    argv = [sys.executable, "-m", "geomx.cli", "launch", str(topology), "--party", "dc1", "--global-scheduler", address,
            "--run-dir", str(tmp_path / "run-twice"), "--", *worker]
    started = time.monotonic()
    try:
        twice = subprocess.run(argv, capture_output=True, text=True, timeout=WAIT_S)
    finally:
        wall = time.monotonic() - started
        stop.write_text("")
        thread.join(timeout=WAIT_S)
    assert not thread.is_alive(), "the first job did not end"
    first = jobs["first"]
    assert isinstance(first, Job), first
    return twice, wall, first


def assert_first_unaffected(first: Job) -> None:
    first.assert_ok()  # every member left: the shutdown round had every party in it
    assert " is dead: " not in first.output and "rejoins in place" not in first.output, first.tail()


@pytest.mark.slow
def test_a_server_party_started_twice_is_refused_in_one_line(tmp_path, reserved_port):
    address = f"127.0.0.1:{reserved_port()}"
    twice, wall, first = start_twice(tmp_path, address, "server")
    output = twice.stdout + twice.stderr
    assert twice.returncode != 0, output
    assert f"[dc1/server] ERROR [dc1/server] the global scheduler at {address} refused this node's registration: " \
           "party 'dc1' is already registered: its local_server still runs (is the party started twice?" in output, \
        output
    assert "Traceback" not in output, output
    assert wall < PROMPT_S, (wall, output)
    assert_first_unaffected(first)
    assert "refused registration from dc1/local_server/" in first.output, first.tail()


@pytest.mark.slow
def test_a_collective_party_started_twice_is_refused_promptly(tmp_path, reserved_port):
    address = f"127.0.0.1:{reserved_port()}"
    twice, wall, first = start_twice(tmp_path, address, "collective")
    output = twice.stdout + twice.stderr
    assert twice.returncode != 0, output
    assert f"the global scheduler at {address} refused this node's registration: party 'dc1' is already " \
           "registered: its worker of rank 0 still runs (is the party started twice?" in output, output
    assert "has not answered yet" not in output and "did not complete" not in output, output
    assert "Traceback" not in output, output
    assert wall < PROMPT_S, (wall, output)
    assert_first_unaffected(first)
    assert "refused registration from dc1/worker/" in first.output, first.tail()
