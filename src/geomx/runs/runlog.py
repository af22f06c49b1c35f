"""Files a run leaves in its run folder: per-process byte counters and metric records.

Every process writes ``stats/<name>.json`` when it stops; workers append ``metrics/<name>.jsonl`` records
through ``kv.record``. The launcher reads both for its summary.

Usage::

    write_stats(run_dir, "dc1/server", {"lan": {...}, "wan": {...}})
    totals = read_stats(run_dir)
"""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path
from typing import Any


def file_name(name: str) -> str:
    """A process name as a file name in the run folder: ``dc0/worker0`` -> ``dc0_worker0``."""
    return name.replace("/", "_")


def peak_rss_bytes() -> int:
    """This process's peak resident set size (Linux reports it in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def cpu_seconds() -> dict[str, float]:
    """This process's CPU time so far, every thread's: ``{"user": s, "sys": s}`` (sys: the kernel's work for it,
    page faults of fresh buffers and socket copies among it)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"user": usage.ru_utime, "sys": usage.ru_stime}


def write_stats(run_dir: Path, name: str, stats: dict[str, Any]) -> Path:
    """Atomically write one process's counters, with its peak resident memory (``peak_rss_bytes``) and CPU time
    so far (``cpu_s``: user and sys, every thread's; ``cpu_sys_s``: the sys part, see ``cpu_seconds``)."""
    cpu = cpu_seconds()
    folder = run_dir / "stats"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{file_name(name)}.json"
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"name": name, "peak_rss_bytes": peak_rss_bytes(), "cpu_s": cpu["user"] + cpu["sys"],
                               "cpu_sys_s": cpu["sys"], **stats}))
    tmp.replace(path)
    return path


def read_stats(run_dir: Path) -> list[dict[str, Any]]:
    folder = run_dir / "stats"
    if not folder.is_dir():
        return []
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]


def write_report(run_dir: Path, kind: str, name: str, report: dict[str, Any]) -> Path:
    """Write one process's report of a feature to ``RUN/<kind>/<name>.json`` (DGT's losses, TSEngine's overlays:
    read by tests and the bench). Usage: ``write_report(run_dir, "dgt", "dc1/server", {...})``."""
    folder = run_dir / kind
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{file_name(name)}.json"
    path.write_text(json.dumps(report))
    return path


def read_reports(run_dir: Path, kind: str) -> dict[str, dict[str, Any]]:
    """Every ``kind`` report of a run, by file stem (``dc1_server``); none if no process wrote one."""
    folder = run_dir / kind
    return {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))} if folder.is_dir() else {}


def append_metrics(run_dir: Path, name: str, record: dict[str, Any]) -> None:
    folder = run_dir / "metrics"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{file_name(name)}.jsonl", "a") as handle:
        handle.write(json.dumps({"time": time.time(), **record}) + "\n")


def read_metrics(run_dir: Path) -> dict[str, list[dict[str, Any]]]:
    folder = run_dir / "metrics"
    if not folder.is_dir():
        return {}
    result = {}
    for path in sorted(folder.glob("*.jsonl")):
        result[path.stem] = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return result
