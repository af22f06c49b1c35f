"""One job's party launchers (``geomx launch --party``) sharing a run folder: each launcher's summary describes
the processes it started, ``geomx report`` the whole job. (The real processes: tests/integration/
test_shared_run_dir.py.)

Before: the summary read every stats file and metrics record written since the launcher started, so a party's
launcher named the other party's still-running processes as "stopped before a clean exit" and added their bytes
and workers' records to its own.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from geomx.runs.report import build_report
from geomx.runs.runlog import file_name, stats_path
from geomx.runs.summary import summarize, summary_text

# launcher A: the central party dc0 (with the global tier); launcher B: dc1, on another host, the same folder
CENTRAL = ("global_scheduler", "global_server0", "dc0/scheduler", "dc0/server", "dc0/worker0")
OTHER = ("dc1/scheduler", "dc1/server", "dc1/worker0")


def stats(run_dir: Path, name: str, party: str, wan_sent: int, final: bool, at: float) -> None:
    """One process's stats file, last written at ``at``."""
    path = stats_path(run_dir, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"name": name, "pid": -1, "role": "x", "party": party, "final": final,
                                "lan": {"sent": 10, "recv": 0}, "wan": {"sent": wan_sent, "recv": 0}}))
    os.utime(path, (at, at))


def record(run_dir: Path, name: str, at: float, **fields: object) -> None:
    folder = run_dir / "metrics"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{file_name(name)}.jsonl", "a") as handle:
        handle.write(json.dumps({"time": at, **fields}) + "\n")


def two_launchers(run_dir: Path, now: float) -> float:
    """dc1's launcher started first (returned: its start) and ended cleanly; dc0's processes still run (their
    counts not final) when dc1's launcher writes its summary."""
    started = now - 30.0
    for name in CENTRAL:
        stats(run_dir, name, "dc0", wan_sent=1000, final=False, at=now - 1.0)
    for name in OTHER:
        stats(run_dir, name, "dc1", wan_sent=100, final=True, at=now - 2.0)
    record(run_dir, "dc0/worker0", now - 5.0, step=20, loss=0.25, wan_bytes_total=5000)
    record(run_dir, "dc1/worker0", now - 4.0, step=20, loss=0.5)
    return started


def test_a_party_launchers_summary_counts_only_its_own_processes(tmp_path):
    started = two_launchers(tmp_path, time.time())
    summary = summarize(tmp_path, 25.0, since=started, processes={name: 1 for name in OTHER})  # (pids()'s shape)
    assert summary["not_final"] == []  # the central party's running processes are not this launcher's
    assert summary["processes_reporting"] == 3
    assert summary["wan_bytes"] == 300 and summary["lan_bytes"] == 30
    assert summary["wan_bytes_sent_by_party"] == {"dc1": 300}
    assert list(summary["last_metrics"]) == ["dc1_worker0"] and not summary["earlier_runs"]
    assert summary["other_processes"] == sorted(CENTRAL)
    text = summary_text(0, None, 25.0, summary)
    assert "counted until" not in text and "dc0 " not in text and "loss=0.25" not in text, text
    assert "other launches: left out (dc0/scheduler, dc0/server, dc0/worker0, global_scheduler" in text, text

    central = summarize(tmp_path, 25.0, since=started, processes=CENTRAL)  # the central launcher, stopped now
    assert central["not_final"] == sorted(CENTRAL) and central["wan_bytes"] == 5000
    assert list(central["last_metrics"]) == ["dc0_worker0"] and central["other_processes"] == sorted(OTHER)


def test_the_whole_job_still_counts_every_process(tmp_path):
    started = two_launchers(tmp_path, time.time())
    whole = summarize(tmp_path, 25.0, since=started)  # no launcher's processes given: every file, as before
    assert whole["wan_bytes"] == 5300 and whole["processes_reporting"] == 8 and whole["other_processes"] == []
    assert "other launches" not in summary_text(0, None, 25.0, whole)
    [row] = build_report([tmp_path], tmp_path / "report")
    assert row["wan_mb"] == 5300 / 1e6 and row["lan_mb"] == 80 / 1e6  # geomx report: both launchers' processes
