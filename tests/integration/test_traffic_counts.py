"""The job's byte totals have one source (issue 46): the stats files every process keeps as it goes.

- A finished job: the launcher's summary, the sum of the stats files and ``geomx report``'s ``wan_mb`` agree to
  the byte (they differed: the report showed the global servers' sent + received as the master read them at its
  last record, without the shutdown round and the schedulers' traffic, 6.77 against the launcher's 6.92 MB).
- A job stopped mid-run (``geomx launch`` sent SIGINT): its summary says how many bytes crossed (it said
  ``LAN traffic : 0.00 MB``: only a clean exit wrote the stats files).
- A worker that dies without a clean exit (``os._exit``): its bytes are still counted, from the file it rewrote
  while it ran, and the summary names it as counted up to its last count.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import jobkit
from harness import worker_command, write_topology

from geomx.launch import format_summary
from geomx.runs.report import build_report
from geomx.runs.runlog import read_stats

# 2 parties x 2 workers under HiPS: the global scheduler and server, a scheduler and a server per party, 4 workers
PROCESSES = 2 + 2 * 2 + 4


def _mb(line_name: str, text: str) -> float:
    match = re.search(rf"^{line_name}\s*: ([0-9.]+) MB", text, re.MULTILINE)
    assert match, (line_name, text)
    return float(match.group(1))


def test_launcher_stats_files_and_report_agree_to_the_byte(geomx_job, tmp_path):
    job = geomx_job("traffic_loop.py", "--steps", "6")
    job.assert_ok()
    stats = read_stats(job.run_dir)
    # every process wrote its counters, schedulers too (registration and heartbeats cross the WAN), all final
    assert len(stats) == PROCESSES, sorted(s["name"] for s in stats)
    assert all(s["final"] for s in stats), [s["name"] for s in stats if not s["final"]]
    assert job.summary["not_final"] == []
    wan = sum(s["wan"]["sent"] for s in stats)
    lan = sum(s["lan"]["sent"] for s in stats)
    assert job.summary["wan_bytes"] == wan and job.summary["lan_bytes"] == lan
    assert wan >= 2 * 6 * 20_000 * 4  # dc1's sum up and the new value down, every step
    row, = build_report([job.run_dir], tmp_path / "report")
    assert round(row["wan_mb"] * 1e6) == wan and round(row["lan_mb"] * 1e6) == lan, (row, wan, lan)
    # the master's last record read the global servers before the shutdown round: not the job's total
    last = job.summary["last_metrics"]["dc0_worker0"]
    assert last["wan_mb"] * 1e6 < wan
    text = format_summary(job.result)
    assert _mb("WAN traffic", text) == round(wan / 1e6, 2) and _mb("LAN traffic", text) == round(lan / 1e6, 2)


def test_a_stopped_job_reports_what_crossed(tmp_path):
    topology = write_topology(tmp_path / "job.yaml")
    run_dir = tmp_path / "run"
    started = jobkit.out_dir(run_dir) / "started"
    command = [sys.executable, "-m", "geomx.cli", "launch", str(topology), "--run-dir", str(run_dir), "--",
               *worker_command("traffic_loop.py", "--steps", "0", "--started-after", "5")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(jobkit.__file__).rsplit("/", 1)[0],
                                                                   os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while not started.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert started.exists(), "the job never got through 5 steps"
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, output[-3000:]
    summary = output[output.index("=== geomx run summary ==="):]
    assert "status        : interrupted" in summary, summary
    # dc1's sum crossed the WAN and every worker's tensor its LAN at least 5 times before the stop
    assert _mb("LAN traffic", summary) >= 4 * 5 * 20_000 * 4 / 1e6, summary
    assert _mb("WAN traffic", summary) >= 2 * 5 * 20_000 * 4 / 1e6, summary
    stats = read_stats(run_dir)
    assert round(_mb("LAN traffic", summary) * 1e6) == round(sum(s["lan"]["sent"] for s in stats), -4)


def test_a_worker_that_dies_is_counted_up_to_its_last_count(geomx_job):
    job = geomx_job("traffic_loop.py", "--steps", "40", "--die-rank", "3", "--die-after", "4")
    assert job.result.exit_code != 0 and job.result.failed is not None, job.tail()
    stats = {s["name"]: s for s in read_stats(job.run_dir)}
    dead = stats[job.result.failed]  # global rank 3; the others were stopped (SIGTERM) after it
    assert dead["final"] is False and dead["lan"]["sent"] >= 4 * 20_000 * 4, dead  # its 4 steps' pushes, at least
    assert job.result.failed in job.summary["not_final"]
    assert job.summary["lan_bytes"] == sum(s["lan"]["sent"] for s in stats.values())
    text = format_summary(job.result)
    assert f"counted until : their last count for {', '.join(job.summary['not_final'])}" in text, text
