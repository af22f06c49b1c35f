"""Files a run leaves in its run folder: per-process byte counters and metric records.

Every process keeps ``stats/<name>.json`` (its byte counters) up to date while it runs, rewriting it every second
and once more, marked ``final``, when it stops (``StatsFile``): a job that fails or is interrupted still says what
crossed each link up to its processes' last count. Workers append ``metrics/<name>.jsonl`` records through
``kv.record``. The launcher's summary and ``geomx report`` read the same stats files (``runs.summary.traffic``).

Usage::

    with StatsFile(run_dir, "dc1/server", lambda: {"role": "local_server", **van.counters.snapshot()}):
        ...  # serve; the file is rewritten every second, and marked final at the end
    totals = read_stats(run_dir)
"""

from __future__ import annotations

import json
import os
import resource
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

STATS_EVERY_S = 1.0  # how often a running process rewrites its stats file


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


def stats_path(run_dir: Path, name: str) -> Path:
    """Where this process keeps its counters: ``RUN/stats/<name>.json``, or where an earlier process of the same
    name wrote there (a party restarted into the same run folder), the first free ``<name>.<n>.json``: each
    process's bytes count once, and the dead one's are not overwritten."""
    folder = run_dir / "stats"
    path = folder / f"{file_name(name)}.json"
    mine = os.getpid()
    number = 1
    while path.exists() and _writer(path) != mine:
        path = folder / f"{file_name(name)}.{number}.json"
        number += 1
    return path


def _writer(path: Path) -> int | None:
    """The pid that wrote a stats file (None: unreadable, or written before files said so)."""
    try:
        pid = json.loads(path.read_text()).get("pid")
    except (OSError, ValueError):
        return None
    return pid if isinstance(pid, int) else None


def write_stats(run_dir: Path, name: str, stats: dict[str, Any], path: Path | None = None) -> Path:
    """Atomically write one process's counters (to ``path``, by default ``stats_path``'s), with its pid, its peak
    resident memory (``peak_rss_bytes``) and CPU time so far (``cpu_s``: user and sys, every thread's;
    ``cpu_sys_s``: the sys part, see ``cpu_seconds``)."""
    cpu = cpu_seconds()
    path = path or stats_path(run_dir, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"name": name, "pid": os.getpid(), "peak_rss_bytes": peak_rss_bytes(),
                               "cpu_s": cpu["user"] + cpu["sys"], "cpu_sys_s": cpu["sys"], **stats}))
    tmp.replace(path)
    return path


class StatsFile:
    """One process's counters in ``RUN/stats/<name>.json``, rewritten every ``every_s`` seconds by a daemon thread
    (``final: false``) and once more by ``close`` (``final: true``, with ``extra``).

    Why: a process that is killed, or whose job is stopped, never reaches its clean exit; its file still holds
    what it counted up to its last rewrite, and says that the count is not final. ``read`` gives the fields to
    write (the counters, role, party); it is called from the thread, so it must be thread-safe (the van's
    counters are). A ``run_dir`` of None writes nothing.

    Usage::

        stats = StatsFile(run_dir, name, lambda: {"role": "worker", **van.counters.snapshot()}).start()
        ...
        stats.close(answer_leads=leads)
    """

    def __init__(self, run_dir: Path | None, name: str, read: Callable[[], dict[str, Any]],
                 every_s: float = STATS_EVERY_S) -> None:
        self.run_dir = run_dir
        self.name = name
        self._read = read
        self._every_s = every_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._path: Path | None = None  # chosen at the first write (``stats_path``)

    def start(self) -> StatsFile:
        """Write once now, then every ``every_s`` seconds until ``close``."""
        if self.run_dir is None:
            return self
        self.flush()
        self._thread = threading.Thread(target=self._loop, name=f"{self.name}-stats", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self._every_s):
            self.flush()

    def flush(self, final: bool = False, **extra: Any) -> Path | None:
        """Write the counters now (``final``: the last time; later rewrites are refused)."""
        if self.run_dir is None:
            return None
        with self._lock:
            if self._closed:
                return None
            self._closed = final
            if self._path is None:
                self._path = stats_path(self.run_dir, self.name)
            return write_stats(self.run_dir, self.name, {**self._read(), **extra, "final": final}, self._path)

    def close(self, **extra: Any) -> Path | None:
        """Stop the rewrites and write the final counters (with ``extra``). Safe to call twice."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
        return self.flush(final=True, **extra)

    def __enter__(self) -> StatsFile:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.close()


def read_stats(run_dir: Path, since: float | None = None) -> list[dict[str, Any]]:
    """Every process's counters, one entry a stats file. ``since`` (a ``time.time()``): only the files written
    since then. Why: a resumed job's processes write files of their own next to the interrupted run's
    (``stats_path``), and a running process rewrites its file every second, so the files of a run that started at
    ``since`` are the ones written since (``geomx launch``'s summary of this run, not of the earlier ones)."""
    folder = run_dir / "stats"
    if not folder.is_dir():
        return []
    paths = sorted(folder.glob("*.json"))
    if since is not None:
        paths = [p for p in paths if p.stat().st_mtime >= since]
    return [json.loads(p.read_text()) for p in paths]


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


def read_metrics(run_dir: Path, since: float | None = None) -> dict[str, list[dict[str, Any]]]:
    """Every worker's records, by file stem (``dc0_worker0``), in the order written. ``since`` (a
    ``time.time()``): only the records appended since then (a resumed run appends to the interrupted one's files);
    a worker with none keeps an empty list."""
    folder = run_dir / "metrics"
    if not folder.is_dir():
        return {}
    result = {}
    for path in sorted(folder.glob("*.jsonl")):
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        result[path.stem] = records if since is None else [r for r in records if r.get("time", since) >= since]
    return result


def earlier_job(run_dir: Path) -> list[str]:
    """The folders of ``run_dir`` where an earlier job left counters or metrics (``stats``, ``metrics``): a new job
    there would add its own to theirs (metrics lines are appended, every stats file is summed). Empty for a new
    folder. Usage: ``earlier_job(Path("runs/lm"))`` -> ``["metrics", "stats"]``."""
    return [name for name in ("metrics", "stats") if (run_dir / name).is_dir() and any((run_dir / name).iterdir())]
