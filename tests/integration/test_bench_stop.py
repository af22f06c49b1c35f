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


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_geomx_bench_and_everything_it_started(tmp_path, sig):
    out = tmp_path / "bench"
    tag = uuid.uuid4().hex
    bench = subprocess.Popen([sys.executable, "-m", "geomx.cli", "bench", "--quick", "--only", "security",
                              "--out", str(out)],
                             env={**os.environ, "STOP_TEST_TAG": tag}, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    stats = out / "runs" / "security-secret" / "stats"  # the second job (the first: security-none)
    try:
        deadline = time.monotonic() + 120
        while not (stats.is_dir() and any(p.name.startswith("dc0_worker") for p in stats.iterdir())):
            assert bench.poll() is None and time.monotonic() < deadline, "the second job never ran"
            time.sleep(0.05)
        job = [pid for pid in tagged(tag) if pid != bench.pid]
        assert len(job) >= 3, job  # the global scheduler and server and the worker, at least
        bench.send_signal(sig)
        sent = time.monotonic()
        output, _ = bench.communicate(timeout=SHUTDOWN_S + 30)
        took = time.monotonic() - sent
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.communicate()
        for pid in tagged(tag):  # never leave them to the next test, whatever failed
            os.kill(pid, signal.SIGKILL)
    assert bench.returncode == 130, output[-3000:]
    assert took < SHUTDOWN_S, (took, output[-3000:])
    left = tagged(tag)
    assert left == [], f"processes the bench started outlived it: {left}"
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
    tag = uuid.uuid4().hex
    section = subprocess.Popen([sys.executable, "-m", "geomx.bench.security", "--out", str(out)],
                               env={**os.environ, "STOP_TEST_TAG": tag}, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    stats = out / "runs" / "security-secret" / "stats"  # the second job (the first: security-none)
    try:
        deadline = time.monotonic() + 120
        while not (stats.is_dir() and any(p.name.startswith("dc0_worker") for p in stats.iterdir())):
            assert section.poll() is None and time.monotonic() < deadline, "the second job never ran"
            time.sleep(0.05)
        section.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        output, _ = section.communicate(timeout=SHUTDOWN_S + 30)
        took = time.monotonic() - sent
    finally:
        if section.poll() is None:
            section.kill()
            section.communicate()
        for pid in tagged(tag):  # never leave them to the next test, whatever failed
            os.kill(pid, signal.SIGKILL)
    assert section.returncode == 130, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert took < SHUTDOWN_S, (took, output[-3000:])
    assert tagged(tag) == [], "processes the section started outlived it"
    written = json.loads((out / "security.json").read_text())
    assert written["interrupted"] is True
    assert len(written["raw"]["none"]) == 1 and written["raw"]["secret"] == [] == written["raw"]["curve"]
    assert not (out / "runs" / "security-curve").exists()  # no job started after the stop
    assert "[security] interrupted by SIGTERM: the rows above are those finished before the stop" in output
