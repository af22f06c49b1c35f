"""Stopping is stopping (issue 46): SIGTERM or SIGINT to ``geomx bench`` ends it and every process it started.

Seen before: SIGTERM, then Ctrl-C, to ``geomx bench --only scale`` each ended only the job in flight, and the bench
started its next row; nothing it had measured was written. Here the real command runs ``--only security`` (the
same shape as scale: one ``launch`` per row, a failed row recorded and the next one started); once its second job
is running (its worker's counters are in its run folder) the bench gets one signal. It must exit 130 within the
job's shutdown timeout, having started no further job, with no process it started left (every one carries a tag
in its environment, found by a /proc scan), and with bench.json holding the row finished before the stop, marked
interrupted.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

SHUTDOWN_S = 30.0  # the security section's topology: the default shutdown timeout


def tagged(tag: str) -> list[int]:
    """Live processes whose environment holds ``STOP_TEST_TAG=tag`` (zombies have none readable)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if f"STOP_TEST_TAG={tag}".encode() in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@dataclass
class Stopped:
    """What a bench command stopped by a signal in its second job left: its exit code and output, how long it took
    to end after the signal, the processes it had started by then (their pids), and those left after it."""
    code: int
    output: str
    took: float
    started: list[int]
    left: list[int]


def stop_in_second_job(argv: list[str], out: Path, sig: signal.Signals) -> Stopped:
    """Run ``argv`` (a bench of the security section, writing to ``out``) and send it ``sig`` once its second job
    runs (that job's worker has written its counters); every process it started carries a tag in its environment,
    and whatever is left of them is killed, whatever failed."""
    tag = uuid.uuid4().hex
    bench = subprocess.Popen(argv, env={**os.environ, "STOP_TEST_TAG": tag}, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    stats = out / "runs" / "security-secret" / "stats"  # the second job (the first: security-none)
    try:
        deadline = time.monotonic() + 120
        while not (stats.is_dir() and any(p.name.startswith("dc0_worker") for p in stats.iterdir())):
            assert bench.poll() is None and time.monotonic() < deadline, "the second job never ran"
            time.sleep(0.05)
        started = [pid for pid in tagged(tag) if pid != bench.pid]
        bench.send_signal(sig)
        sent = time.monotonic()
        output, _ = bench.communicate(timeout=SHUTDOWN_S + 30)
        took = time.monotonic() - sent
        left = tagged(tag)
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.communicate()
        for pid in tagged(tag):  # never leave them to the next test
            os.kill(pid, signal.SIGKILL)
    return Stopped(bench.returncode, output, took, started, left)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_geomx_bench_and_everything_it_started(tmp_path, sig):
    out = tmp_path / "bench"
    stopped = stop_in_second_job([sys.executable, "-m", "geomx.cli", "bench", "--quick", "--only", "security",
                                  "--out", str(out)], out, sig)
    output = stopped.output
    assert len(stopped.started) >= 3, stopped.started  # the global scheduler and server and the worker, at least
    assert stopped.code == 130, output[-3000:]
    assert stopped.took < SHUTDOWN_S, (stopped.took, output[-3000:])
    assert stopped.left == [], f"processes the bench started outlived it: {stopped.left}"
    report = json.loads((out / "bench.json").read_text())
    name = signal.Signals(sig).name
    assert report["interrupted"] == {"signal": name, "section": "security"}, report.get("interrupted")
    assert report["security_error"] == f"interrupted by {name}"
    section = report["security"]
    assert section["interrupted"] is True
    # the first job's figures were kept; the one in flight and every later one have none
    assert len(section["raw"]["none"]) == 1 and section["raw"]["secret"] == [] == section["raw"]["curve"]
    assert all(row.get("none_gbps") for row in section["rows"]), section["rows"]
    assert not (out / "runs" / "security-curve").exists()  # no job started after the stop
    assert "the rows above are those finished before the stop" in output


@pytest.mark.slow
def test_sigterm_to_a_section_run_alone_writes_what_it_finished_and_exits_130(tmp_path: Path):
    """A section run on its own (``python -m geomx.bench.NAME``) stops as ``geomx bench`` does. Seen before: SIGTERM to
    ``python -m geomx.bench.chaos`` printed a traceback ending in ``geomx.bench.sections.Interrupted`` and saved no
    chaos.json. Here ``python -m geomx.bench.security`` gets SIGTERM once its second job runs: it must exit 130
    without a traceback, within the shutdown timeout, leave no process, and OUT/security.json must hold the row
    finished before the stop, marked interrupted."""
    out = tmp_path / "bench"
    stopped = stop_in_second_job([sys.executable, "-m", "geomx.bench.security", "--out", str(out)], out,
                                 signal.SIGTERM)
    output = stopped.output
    assert stopped.code == 130, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert stopped.took < SHUTDOWN_S, (stopped.took, output[-3000:])
    assert stopped.left == [], "processes the section started outlived it"
    written = json.loads((out / "security.json").read_text())
    assert written["interrupted"] is True
    assert len(written["raw"]["none"]) == 1 and written["raw"]["secret"] == [] == written["raw"]["curve"]
    assert not (out / "runs" / "security-curve").exists()  # no job started after the stop
    assert "[security] interrupted by SIGTERM: the rows above are those finished before the stop" in output
