"""``geomx bench --only transport``: geomx's pushpull against torch.distributed gloo on loopback.

``kv.pushpull`` of a 4 MB and a 100 MB float32 tensor between a worker and the global server on loopback
(no emulation), against ``torch.distributed`` gloo ``all_reduce`` of the same tensor between 2
processes. Ratio geomx / gloo.

Usage::

    section = run(BenchPlan(quick=True), Path("bench-results"))
    print("\\n".join(lines(section)))
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .jobs import free_port, kill_all, master_records, run_job, write_topology
from .sections import BenchPlan, Interrupted
from .tables import fmt, say, table


@dataclass(frozen=True)
class TransportPlan:
    """Tensor sizes, timed operations after ``warmup`` untimed ones, and whether to run the 2-worker job."""

    sizes_mb: tuple[float, ...]
    reps: int
    warmup: int
    two_workers: bool = True


QUICK = TransportPlan(sizes_mb=(4.0, 100.0), reps=10, warmup=2)
FULL = TransportPlan(sizes_mb=(4.0, 100.0), reps=30, warmup=3)


def transport_topology(workers: int) -> dict[str, Any]:
    """One party, one global server, flat: the worker(s) talk straight to the global server, no emulation."""
    return {"parties": {"dc0": {"workers": workers}}, "central": "dc0", "global_servers": 1, "mode": "flat"}


def bench_geomx_pushpull(plan: TransportPlan, out_dir: Path, workers: int) -> list[dict[str, Any]]:
    """One job of ``workers`` workers pushpulling each size; the master's records (one per size)."""
    topology = write_topology(out_dir / "topologies" / f"transport-{workers}w.yaml", transport_topology(workers))
    command = [sys.executable, "-m", "geomx.bench.workers.transport", "--sizes-mb",
               *[f"{s:g}" for s in plan.sizes_mb], "--reps", str(plan.reps), "--warmup", str(plan.warmup)]
    name = f"transport-geomx-{workers}w"
    say(f"[transport] {name}: pushpull of {', '.join(f'{s:g} MB' for s in plan.sizes_mb)} "
        f"x{plan.reps} ({workers} worker{'s' if workers > 1 else ''} + 1 global server) ...")
    result, metrics = run_job(name, topology, command, out_dir)
    if result.exit_code != 0:
        raise RuntimeError(f"{name} failed ({result.failed}); see {out_dir / 'logs' / name}.log")
    records = master_records(metrics)
    if len(records) != len(plan.sizes_mb):
        raise RuntimeError(f"{name}: expected {len(plan.sizes_mb)} records, got {len(records)}")
    for record in records:
        record["wall_s"] = result.wall_s
    return records


def bench_gloo(plan: TransportPlan, out_dir: Path, world: int = 2, timeout_s: float = 300.0) -> list[dict[str, Any]]:
    """gloo all_reduce of each size between ``world`` processes; every process is gone when this returns."""
    say(f"[transport] gloo all_reduce of {', '.join(f'{s:g} MB' for s in plan.sizes_mb)} x{plan.reps} "
        f"({world} processes) ...")
    out_file = out_dir / "runs" / "transport-gloo.json"
    out_file.parent.mkdir(parents=True, exist_ok=True)
    out_file.unlink(missing_ok=True)
    port = free_port()
    log_path = out_dir / "logs" / "transport-gloo.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    procs: list[subprocess.Popen[bytes]] = []
    with open(log_path, "w") as log:
        for rank in range(world):
            argv = [sys.executable, "-m", "geomx.bench.workers.gloo", "--rank", str(rank), "--world", str(world),
                    "--port", str(port), "--out", str(out_file), "--reps", str(plan.reps),
                    "--warmup", str(plan.warmup), "--sizes-mb", *[f"{s:g}" for s in plan.sizes_mb]]
            procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        deadline = time.monotonic() + timeout_s
        try:
            # one rank failing early would leave the other waiting for it: stop all at the first failure
            while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
                if any(p.poll() not in (None, 0) for p in procs):
                    break
                time.sleep(0.05)
        finally:
            stuck = kill_all(procs)
        codes = [p.returncode for p in procs]
    if stuck:
        raise RuntimeError(f"gloo all_reduce: pids {stuck} did not exit after SIGKILL; see {log_path}")
    if any(codes) or not out_file.is_file():
        raise RuntimeError(f"gloo all_reduce failed (exit codes {codes}); see {log_path}")
    return list(json.loads(out_file.read_text()))


def run(plan: BenchPlan, out_dir: Path) -> dict[str, Any]:
    """The section's entry point: geomx with 1 and 2 workers and gloo, each size; the figures for bench.json."""
    sizes = QUICK if plan.quick else FULL
    section: dict[str, Any] = {
        "setup": {"sizes_mb": list(sizes.sizes_mb), "reps": sizes.reps, "warmup": sizes.warmup,
                  "geomx": "flat topology, 1 party, 1 global server, links unlimited (loopback TCP); "
                           "kv.pushpull(key, value, out=out); default slice_elems (1M elements)",
                  "gloo": "torch.distributed gloo all_reduce, 2 processes, tcp:// on 127.0.0.1",
                  "gbps": "tensor bytes / mean time per operation, 1 GB = 1e9 bytes"},
        "errors": [],
    }
    measured: dict[str, list[dict[str, Any]]] = {}
    jobs: list[tuple[str, Callable[[], list[dict[str, Any]]]]] = [
        ("geomx_1w", lambda: bench_geomx_pushpull(sizes, out_dir, 1)),
        ("gloo_2p", lambda: bench_gloo(sizes, out_dir, 2))]
    if sizes.two_workers:
        jobs.append(("geomx_2w", lambda: bench_geomx_pushpull(sizes, out_dir, 2)))
    try:
        for label, job in jobs:
            try:
                measured[label] = job()
                for entry in measured[label]:
                    say(f"[transport] {label} {entry['size_mb']:g} MB: {entry['mean_s'] * 1000:.1f} ms/op, "
                        f"{entry['gbps']:.3f} GB/s")
            except Exception as exc:  # record and go on: the other measurements still count
                section["errors"].append(f"{label}: {exc}")
                say(f"[transport] {label} FAILED: {exc}")
    except KeyboardInterrupt:  # SIGINT/SIGTERM: the jobs measured so far are written, marked interrupted
        section["interrupted"] = True
        raise Interrupted(_rows(section, sizes, measured)) from None
    return _rows(section, sizes, measured)


def _rows(section: dict[str, Any], sizes: TransportPlan, measured: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    section["raw"] = measured
    section["rows"] = transport_rows(sizes.sizes_mb, measured)
    return section


def transport_rows(sizes_mb: tuple[float, ...], measured: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per size: each job's GB/s and times, and geomx / gloo from the means and from the medians."""
    rows = []
    for index, size in enumerate(sizes_mb):
        row: dict[str, Any] = {"size_mb": size}
        for label, entries in measured.items():
            if index < len(entries):
                row[f"{label}_gbps"] = entries[index]["gbps"]
                row[f"{label}_ms"] = entries[index]["mean_s"] * 1000
                row[f"{label}_median_ms"] = entries[index]["median_s"] * 1000
        gloo = row.get("gloo_2p_gbps")
        for label in ("geomx_1w", "geomx_2w"):
            if gloo and row.get(f"{label}_gbps") is not None:
                row[f"{label}_over_gloo"] = row[f"{label}_gbps"] / gloo
                # time ratio of the medians: gloo time / geomx time = geomx GB/s / gloo GB/s
                row[f"{label}_over_gloo_median"] = row["gloo_2p_median_ms"] / row[f"{label}_median_ms"]
        rows.append(row)
    return rows


def lines(transport: dict[str, Any]) -> list[str]:
    """The section's table for ``geomx bench``'s report."""
    setup = transport["setup"]
    out = [f"[transport] loopback, no emulation; {setup['reps']} timed ops after {setup['warmup']} "
           "warm-up; GB/s = tensor bytes / time per op"]
    rows = []
    for row in transport.get("rows", []):
        rows.append([f"{row['size_mb']:g} MB",
                     fmt(row.get("geomx_1w_gbps"), ".3f"), fmt(row.get("gloo_2p_gbps"), ".3f"),
                     fmt(row.get("geomx_1w_over_gloo"), ".2f", "x"),
                     fmt(row.get("geomx_2w_gbps"), ".3f"), fmt(row.get("geomx_2w_over_gloo"), ".2f", "x")])
    out += table(["tensor", "geomx 1w GB/s", "gloo 2p GB/s", "geomx/gloo", "geomx 2w GB/s", "geomx 2w/gloo"], rows)
    out.append("note: geomx = kv.pushpull worker <-> global server (flat, 1 party; 2w: two workers, "
               "3 processes); gloo = all_reduce between 2 processes; goal geomx/gloo >= 1.0.")
    medians = [f"{row['size_mb']:g} MB {row['geomx_1w_over_gloo_median']:.2f}x"
               + (f" (2w {row['geomx_2w_over_gloo_median']:.2f}x)" if "geomx_2w_over_gloo_median" in row else "")
               for row in transport.get("rows", []) if "geomx_1w_over_gloo_median" in row]
    if medians:
        out.append(f"      geomx/gloo from median times (robust to load bursts): {', '.join(medians)}.")
    for error in transport.get("errors", []):
        out.append(f"error: {error}")
    return out
