"""``geomx report RUN [RUN...]``: plots and a table from the metrics that runs left in their run folders.

Each run folder (``geomx launch --run-dir``) holds ``metrics/<worker>.jsonl``. The report follows one
worker per run (the master worker: the one whose records carry the job's ``wan_bytes_total``, else the
first), and draws, one line per run:

- ``loss.png``: loss against wall time;
- ``accuracy.png``: accuracy against wall time (when the script reported any);
- ``wan_bytes.png``: cumulative bytes over the WAN against wall time;

and writes ``report.md`` (a table, with what each column counts under it) and ``report.json`` (the same
numbers). Both the front end's records (``loss``, ``accuracy``, ``wan_bytes_total``, ``elapsed_s``) and the
examples' epoch records (``test_accuracy``, ``wan_mb``) are understood. The columns (``COLUMNS``) are the
followed worker's, except ``wan_mb`` and ``lan_mb``, which are the whole job's, from the stats files every process
keeps (``runs.summary.traffic``: the same figures, to the byte, as ``geomx launch``'s summary).

A job resumed with ``geomx launch --resume`` keeps one run folder: the report covers the whole job, every launch
of it, one after the other. ``steps`` is the job's last step (the wrapper counts on from the checkpoint's step),
the time axis and ``wall_s`` add up the launches' own times (the time between them, the job down, is left out),
the WAN curve, ``net_wait_s``, ``wan_mb`` and ``lan_mb`` add up the launches' counts (each launch's processes
count from 0), and the final loss and accuracy are the last launch's. A ``launches`` column (how many) is added
where a run folder holds more than one; ``geomx launch``'s own summary is of its launch alone.

Usage::

    geomx report runs/fsa runs/hfa --out report/
    rows = build_report([Path("runs/fsa")], Path("report"))
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .runlog import read_metrics, read_stats
from .summary import traffic

ACCURACY_KEYS = ("accuracy", "test_accuracy", "val_accuracy")

# What each column of the table counts (printed under the table).
COLUMNS = {
    "run": "the run folder (or --label)",
    "worker": "the worker followed: the master (its records carry the job's WAN total), else the first",
    "steps": "that worker's training steps: the job's last step (a resumed job's go on from its checkpoint's)",
    "wall_s": "that worker's elapsed time at its last record, added up over the job's launches (--resume)",
    "final_loss": "that worker's last logged loss",
    "final_accuracy": "that worker's last reported accuracy",
    "best_accuracy": "that worker's best reported accuracy",
    "wan_mb": "the whole job's WAN traffic (MB): bytes every process sent to another party, from RUN/stats (each "
              "process's counters, as the launcher's summary adds them up; '-' while the run has none)",
    "lan_mb": "the whole job's LAN traffic (MB): bytes every process sent inside its party, from RUN/stats "
              "(rewritten every second by each process, final at its exit; '-' while the run has none)",
    "net_wait_s": "that worker's seconds blocked on the network, over every launch (front end only)",
    "launches": "the job's launches in that worker's records: 1 + its resumes that trained (only where a run has "
                "several)",
    # decoupled outer rounds (training.quorum; only where a run has them), from the global servers' stats files
    "outer_rounds": "the global servers' decoupled rounds closed (one per slice and round)",
    "outer_missed": "rounds a party missed (closed by the quorum and the grace without it), summed over the parties",
    "outer_folded": "late deltas folded into a later round, summed over the parties",
    "outer_dropped": "deltas dropped beyond stale_rounds, summed over the parties",
    "outer_lost": "rounds closed while a party was dead and not back, summed over the parties",
}
OUTER_COLUMNS = ("outer_rounds", "outer_missed", "outer_folded", "outer_dropped", "outer_lost")


@dataclass
class Series:
    """One run's curves, times in seconds since its first record."""

    label: str
    worker: str
    loss: list[tuple[float, float]] = field(default_factory=list)
    accuracy: list[tuple[float, float]] = field(default_factory=list)
    wan_bytes: list[tuple[float, float]] = field(default_factory=list)
    steps: int = 0
    wall_s: float = 0.0
    lan_bytes: int | None = None  # the job's, from RUN/stats (None without stats files)
    wan_total_bytes: int | None = None  # the job's, from RUN/stats (None without stats files)
    net_wait_s: float | None = None
    launches: int = 1  # the launches of the job its records span: 1 + its resumes (--resume)
    outer: dict[str, int] | None = None  # the job's decoupled rounds (OUTER_COLUMNS), None where it ran none


def _run_time(record: dict[str, Any], first_time: float) -> float:
    """Seconds since the start of the run (launch) that wrote ``record``: its ``elapsed_s``, else wall time since
    that run's first record."""
    if isinstance(record.get("elapsed_s"), (int, float)):
        return float(record["elapsed_s"])
    return float(record.get("time", first_time)) - first_time


def _starts_a_run(record: dict[str, Any], previous: dict[str, Any] | None) -> bool:
    """``record`` is the first of a later run of the job (``--resume`` appends to the same files): its clock went
    back (``elapsed_s`` below the previous record's) and started (``time - elapsed_s``) after the previous record
    was written, as a new process's does. Within one run a clock starts before its records, so a second clock in
    the same file (the examples' ``Progress`` next to the wrapper's records) does not split it."""
    values = [r.get(k) for r in (record, previous or {}) for k in ("elapsed_s", "time")]
    if not all(isinstance(v, (int, float)) for v in values):
        return False
    elapsed, written, elapsed_before, written_before = map(float, values)
    return elapsed < elapsed_before and written - elapsed >= written_before


def _split_runs(records: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """A worker's records, one list per run of the job (one list where it was never resumed)."""
    runs: list[list[dict[str, Any]]] = []
    previous = None
    for record in records:
        if not runs or _starts_a_run(record, previous):
            runs.append([])
        runs[-1].append(record)
        previous = record
    return runs


def _pick_worker(metrics: dict[str, list[dict[str, Any]]]) -> str:
    for name, records in metrics.items():
        if any("wan_bytes_total" in r or "wan_mb" in r for r in records):
            return name
    return sorted(metrics)[0]


def load_run(run_dir: Path, label: str | None = None) -> Series:
    """The curves of one run folder; ValueError names a folder without metrics."""
    metrics = {name: records for name, records in read_metrics(run_dir).items() if records}
    if not metrics:
        raise ValueError(f"{run_dir} has no metrics/*.jsonl records: is it a run folder of `geomx launch`?")
    worker = _pick_worker(metrics)
    runs = _split_runs(metrics[worker])
    series = Series(label or Path(run_dir).name, worker, launches=len(runs))
    for run in runs:  # the job's time, WAN total and waits go on across its resumes
        _add_run(series, run)
    stats = read_stats(Path(run_dir))
    totals = traffic(stats)  # one file per process, counting what it sent: each byte once
    series.lan_bytes, series.wan_total_bytes = totals["lan_bytes"], totals["wan_bytes"]
    series.outer = outer_rounds(stats)
    return series


def _add_run(series: Series, records: list[dict[str, Any]]) -> None:
    """Append one run's points to ``series``, its times after the earlier runs' (``wall_s``) and its cumulative
    counts (the WAN total, the network waits: each run's processes count from 0) on top of theirs."""
    first = float(records[0].get("time", 0.0))
    offset_s = series.wall_s
    wan_before = series.wan_bytes[-1][1] if series.wan_bytes else 0.0
    wait_before = series.net_wait_s or 0.0
    for record in records:
        t = offset_s + _run_time(record, first)
        if isinstance(record.get("loss"), (int, float)):
            series.loss.append((t, float(record["loss"])))
        for key in ACCURACY_KEYS:
            if isinstance(record.get(key), (int, float)):
                series.accuracy.append((t, float(record[key])))
                break
        if isinstance(record.get("wan_bytes_total"), (int, float)):
            series.wan_bytes.append((t, wan_before + float(record["wan_bytes_total"])))
        elif isinstance(record.get("wan_mb"), (int, float)):
            series.wan_bytes.append((t, wan_before + float(record["wan_mb"]) * 1e6))
        for key in ("step", "steps"):
            if isinstance(record.get(key), int):
                series.steps = max(series.steps, record[key])
        series.wall_s = max(series.wall_s, t)
        if isinstance(record.get("net_wait_s"), (int, float)):
            series.net_wait_s = wait_before + float(record["net_wait_s"])


def outer_rounds(stats: list[dict[str, Any]]) -> dict[str, int] | None:
    """The decoupled rounds of a run (``OUTER_COLUMNS``), summed over its global servers' stats files (their
    ``outer_rounds``, ``geomx.algorithms.hfa.quorum``); None where no server ran any."""
    reports = [entry["outer_rounds"] for entry in stats if isinstance(entry.get("outer_rounds"), dict)]
    if not reports:
        return None

    def total(key: str) -> int:
        return sum(sum(r.get(key, {}).values()) for r in reports)
    return {"outer_rounds": sum(int(r.get("rounds", 0)) for r in reports), "outer_missed": total("missed"),
            "outer_folded": total("late_folded"), "outer_dropped": total("dropped"), "outer_lost": total("lost")}


def summary_row(series: Series, launches: bool = False) -> dict[str, Any]:
    """The table's numbers for one run (None where the run did not report the quantity); ``launches``: with the
    ``launches`` column (where some run folder of the table holds a resumed job)."""
    return {
        "run": series.label,
        "worker": series.worker,
        "steps": series.steps,
        "wall_s": round(series.wall_s, 3),
        "final_loss": round(series.loss[-1][1], 6) if series.loss else None,
        "final_accuracy": round(series.accuracy[-1][1], 6) if series.accuracy else None,
        "best_accuracy": round(max(a for _, a in series.accuracy), 6) if series.accuracy else None,
        "wan_mb": None if series.wan_total_bytes is None else round(series.wan_total_bytes / 1e6, 6),
        "lan_mb": None if series.lan_bytes is None else round(series.lan_bytes / 1e6, 6),
        "net_wait_s": None if series.net_wait_s is None else round(series.net_wait_s, 3),
        **({"launches": series.launches} if launches else {}),
        **(series.outer or {}),
    }


def _table(rows: list[dict[str, Any]]) -> str:
    columns = list(rows[0])
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join("-" if row[c] is None else str(row[c]) for c in columns) + " |")
    lines += [""] + [f"- `{c}`: {COLUMNS[c]}" for c in columns if c in COLUMNS]
    return "\n".join(lines) + "\n"


def _plot(runs: list[Series], attribute: str, ylabel: str, path: Path, scale: float = 1.0) -> bool:
    import matplotlib

    matplotlib.use("Agg")  # files only; never a window
    import matplotlib.pyplot as plt

    curves = [(s.label, getattr(s, attribute)) for s in runs if getattr(s, attribute)]
    if not curves:
        return False
    figure, axes = plt.subplots(figsize=(7, 4.2))
    for label, points in curves:
        axes.plot([t for t, _ in points], [v * scale for _, v in points], marker="." if len(points) < 40 else None,
                  label=label)
    axes.set_xlabel("wall time (s)")
    axes.set_ylabel(ylabel)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True


def build_report(run_dirs: list[Path], out_dir: Path, labels: list[str] | None = None) -> list[dict[str, Any]]:
    """Write the plots, ``report.md`` and ``report.json`` into ``out_dir``; returns the table rows."""
    if not run_dirs:
        raise ValueError("give at least one run folder")
    if labels is not None and len(labels) != len(run_dirs):
        raise ValueError(f"{len(labels)} labels for {len(run_dirs)} runs")
    runs = [load_run(Path(d), labels[i] if labels else None) for i, d in enumerate(run_dirs)]
    names = [s.label for s in runs]
    if len(set(names)) != len(names):  # two folders with the same name: tell them apart by their paths
        for series, run_dir in zip(runs, run_dirs, strict=True):
            series.label = str(run_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"--out {out_dir} is a file: give a folder for the plots and the table")
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = {}
    for attribute, ylabel, name, scale in (("loss", "loss", "loss.png", 1.0),
                                           ("accuracy", "accuracy", "accuracy.png", 1.0),
                                           ("wan_bytes", "cumulative WAN traffic (MB)", "wan_bytes.png", 1e-6)):
        if _plot(runs, attribute, ylabel, out_dir / name, scale):
            plots[attribute] = name
    rows = [summary_row(s, launches=any(r.launches > 1 for r in runs)) for s in runs]
    if any(s.outer for s in runs):  # every row gets the decoupled rounds' columns ('-' for a run without them)
        rows = [{**row, **{c: row.get(c) for c in OUTER_COLUMNS}} for row in rows]
    (out_dir / "report.md").write_text(_table(rows))
    (out_dir / "report.json").write_text(json.dumps({"rows": rows, "columns": COLUMNS, "plots": plots,
                                                     "series": [asdict(s) for s in runs]}, indent=1))
    return rows


def main(run_dirs: list[str], out: str, labels: list[str] | None = None) -> int:
    """The CLI entry: print the table and where the files went."""
    try:
        rows = build_report([Path(d) for d in run_dirs], Path(out), labels)
    except ValueError as exc:
        print(f"geomx report: {exc}")
        return 2
    print(_table(rows), end="")
    print(f"plots and table in {out}/")
    return 0
