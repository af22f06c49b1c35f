"""``geomx bench``: run the chosen sections one after the other, print their tables, write OUT/bench.json.

Nothing here asserts: the bench prints and writes every raw figure. It returns 1 only when a measurement
could not be taken (a run failed), 130 when interrupted: SIGINT or SIGTERM stop the job in flight and every
process the bench started, no further job starts, and what was measured so far is still written (a section's
finished rows where it hands them over, ``sections.Interrupted``), marked ``interrupted``.

Usage::

    code = run_bench(quick=True, out_dir=Path("bench-results"), sections=["transport"])
"""

from __future__ import annotations

import json
import signal
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..cluster.processes import StopOnSignals
from .jobs import load_avg, machine_info
from .sections import SECTIONS, BenchPlan, Interrupted, Section, chosen, module_of
from .tables import say


def format_report(report: dict[str, Any]) -> str:
    """The whole report: a header with the machine and its load, then each measured section's table."""
    machine = report["machine"]
    out = ["", f"=== geomx bench ({'quick' if report['quick'] else 'full'}) === "
           f"{machine.get('cores')} cores, torch {machine.get('torch')}, python {machine.get('python')}, "
           f"load avg at start {report.get('load_avg_start')}"]
    cores = machine.get("cores") or 1
    load = report.get("load_avg_start")
    if load and load[0] > 0.75 * cores:
        out.append(f"warning: the machine was already busy (1-min load {load[0]} on {cores} cores): "
                   "times and their ratios are noisy; compare medians in bench.json")
    for row in SECTIONS:
        if report.get(row.name):
            out += ["", *module_of(row).lines(report[row.name])]
            if report[row.name].get("interrupted"):
                out.append(f"[{row.name}] {report.get(f'{row.name}_error', 'interrupted')}: the rows above are those "
                           "finished before the stop")
        elif f"{row.name}_error" in report:
            out += ["", f"[{row.name}] not measured: {report[f'{row.name}_error']}"]
    out.append("")
    out.append(f"raw figures: {report.get('json_path')}")
    return "\n".join(out)


def check_plan(plan: BenchPlan, rows: list[Section]) -> None:
    """A ValueError (one line) for flags that would measure nothing: the sync section's ``wide`` rows are the full
    run's (``--quick`` has none: ~4 min more), and ``--scenario`` without the sync section picks no row."""
    if plan.quick and "wide" in plan.sync_scenarios:
        raise ValueError("--scenario wide (the bandwidth-bound CNN's sync rows) is in the full run only: drop --quick")
    if plan.sync_scenarios and "sync" not in [row.name for row in rows]:
        raise ValueError("--scenario picks rows of the sync section, which --only leaves out: add --only sync")


def run_bench(quick: bool, out_dir: Path, sections: list[str] | None = None,
              sync_scenarios: list[str] | None = None, wan_job: str | None = None,
              wan_congestion: str | None = None, scale_path: str = "cpu") -> int:
    """Run the chosen sections (default: every ``default`` row of the table), print the report, write bench.json.

    ``sync_scenarios``: run only those scenarios' rows of the sync section (e.g. ``["wide"]``: the bandwidth-bound
    CNN's flat-PS FSA, HFA and HFA + outer, ~4 minutes). A plan that would measure nothing is a ValueError before
    anything runs (``check_plan``).
    """
    plan = BenchPlan(quick=quick, sync_scenarios=tuple(sync_scenarios or ()), wan_job=wan_job,
                     wan_congestion=wan_congestion, scale_path=scale_path)
    rows = chosen(sections)
    check_plan(plan, rows)
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / "bench.json"
    started = time.monotonic()
    report: dict[str, Any] = {
        "quick": quick, "sections": [row.name for row in rows], "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine_info(), "load_avg_start": load_avg(), "plan": asdict(plan), "json_path": str(json_path),
    }
    failed = False
    interrupted = False
    # SIGINT/SIGTERM: the job in flight stops, then KeyboardInterrupt here; every process left is ended on the way out
    with StopOnSignals() as stop:
        row = rows[0] if rows else None
        try:
            for row in rows:
                try:
                    report[row.name] = module_of(row).run(plan, out_dir)
                    failed = failed or bool(report[row.name].get("errors"))
                except Exception as exc:
                    failed = True
                    report[f"{row.name}_error"] = f"{type(exc).__name__}: {exc}"
                    report[f"{row.name}_traceback"] = traceback.format_exc()
                    say(f"[{row.name}] not measured: {exc}")
        except KeyboardInterrupt as exc:
            stop.ignore()  # the results are written whatever comes next
            interrupted = True
            name = signal.Signals(stop.signum).name if stop.signum else "SIGINT"
            report["interrupted"] = {"signal": name, "section": row.name if row else None}
            if row is not None:
                if isinstance(exc, Interrupted):
                    report[row.name] = exc.partial
                report[f"{row.name}_error"] = f"interrupted by {name}"
                say(f"[{row.name}] interrupted by {name}; writing what was measured so far")
        stop.ignore()
        report["load_avg_end"] = load_avg()
        report["bench_wall_s"] = time.monotonic() - started
        json_path.write_text(json.dumps(report, indent=2, default=str))
        say(format_report(report))
        say(f"bench wall time: {report['bench_wall_s']:.0f} s")
    return 130 if interrupted else 1 if failed else 0
