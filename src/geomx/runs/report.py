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
    "steps": "that worker's training steps",
    "wall_s": "that worker's elapsed time at its last record",
    "final_loss": "that worker's last logged loss",
    "final_accuracy": "that worker's last reported accuracy",
    "best_accuracy": "that worker's best reported accuracy",
    "wan_mb": "the whole job's WAN traffic (MB): bytes every process sent to another party, from RUN/stats (each "
              "process's counters, as the launcher's summary adds them up; '-' while the run has none)",
    "lan_mb": "the whole job's LAN traffic (MB): bytes every process sent inside its party, from RUN/stats "
              "(rewritten every second by each process, final at its exit; '-' while the run has none)",
    "net_wait_s": "that worker's seconds blocked on the network (front end only)",
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
    outer: dict[str, int] | None = None  # the job's decoupled rounds (OUTER_COLUMNS), None where it ran none


def _elapsed(record: dict[str, Any], first_time: float) -> float:
    if isinstance(record.get("elapsed_s"), (int, float)):
        return float(record["elapsed_s"])
    return float(record.get("time", first_time)) - first_time


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
    records = metrics[worker]
    first = float(records[0].get("time", 0.0))
    series = Series(label or Path(run_dir).name, worker)
    for record in records:
        t = _elapsed(record, first)
        if isinstance(record.get("loss"), (int, float)):
            series.loss.append((t, float(record["loss"])))
        for key in ACCURACY_KEYS:
            if isinstance(record.get(key), (int, float)):
                series.accuracy.append((t, float(record[key])))
                break
        if isinstance(record.get("wan_bytes_total"), (int, float)):
            series.wan_bytes.append((t, float(record["wan_bytes_total"])))
        elif isinstance(record.get("wan_mb"), (int, float)):
            series.wan_bytes.append((t, float(record["wan_mb"]) * 1e6))
        for key in ("step", "steps"):
            if isinstance(record.get(key), int):
                series.steps = max(series.steps, record[key])
        series.wall_s = max(series.wall_s, t)
        if isinstance(record.get("net_wait_s"), (int, float)):
            series.net_wait_s = float(record["net_wait_s"])
    stats = read_stats(Path(run_dir))
    totals = traffic(stats)  # one file per process, counting what it sent: each byte once
    series.lan_bytes, series.wan_total_bytes = totals["lan_bytes"], totals["wan_bytes"]
    series.outer = outer_rounds(stats)
    return series


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


def summary_row(series: Series) -> dict[str, Any]:
    """The table's numbers for one run (None where the run did not report the quantity)."""
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
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = {}
    for attribute, ylabel, name, scale in (("loss", "loss", "loss.png", 1.0),
                                           ("accuracy", "accuracy", "accuracy.png", 1.0),
                                           ("wan_bytes", "cumulative WAN traffic (MB)", "wan_bytes.png", 1e-6)):
        if _plot(runs, attribute, ylabel, out_dir / name, scale):
            plots[attribute] = name
    rows = [summary_row(s) for s in runs]
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
