"""``geomx bench --only training``: HiPS against a flat parameter server on the same emulated WAN.

The digits CNN of ``examples/cnn.py`` (Adam on the global server) trained for the same number of steps
under a flat parameter server and under HiPS (fully synchronous), both on the same emulated WAN: 2 parties
x 2 workers, WAN 100 Mbit/s 25 ms one way, LAN 10 Gbit/s 0 ms. Two workloads: the small CNN (38k
parameters, latency-bound on this WAN) and a wide one (1.6M parameters, 6.4 MB of gradients,
bandwidth-bound). Ratios are to the flat PS of the same workload.

Usage::

    section = run(BenchPlan(quick=True), Path("bench-results"))
    print("\\n".join(lines(section)))
"""

from __future__ import annotations

import os
import statistics
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .jobs import LAN, WAN, find_examples, measure, training_topology, warm_caches, write_topology
from .sections import BenchPlan
from .tables import fmt, say, table


@dataclass(frozen=True)
class Workload:
    """One job of the training section: the size of examples/cnn.py's DigitsCNN and how long to train it."""

    name: str  # its key in bench.json
    label: str  # its name in the table
    channels: int
    hidden: int
    batch_size: int
    epochs: int

    def cnn_args(self) -> list[str]:
        return ["--epochs", str(self.epochs), "--batch-size", str(self.batch_size),
                "--channels", str(self.channels), "--hidden", str(self.hidden)]


# digits: 1437 training images / 4 workers = 359 per worker: 11 steps per epoch at batch 32, 5 at batch 64.
# The small CNN (38k parameters, 153 kB of gradients) is latency-bound on the emulated WAN; the wide one
# (1.6M parameters, 6.4 MB) is bandwidth-bound, about 1.5 s per flat-PS step, so it runs fewer steps: batch
# 64 keeps its warm-up epoch (excluded from step ms) at 5 steps.
SMALL_CNN = Workload("small", "small CNN", channels=16, hidden=64, batch_size=32, epochs=20)
WIDE_CNN = Workload("wide", "wide CNN", channels=32, hidden=1536, batch_size=64, epochs=6)


def workloads(quick: bool) -> tuple[tuple[Workload, ...], int]:
    """The workloads and the runs per mode (alternated flat, hips, hips, flat, ... to cancel drift)."""
    if quick:
        return (replace(SMALL_CNN, epochs=5), replace(WIDE_CNN, epochs=2)), 1
    return (SMALL_CNN, WIDE_CNN), 2


def summarize_training_run(records: list[dict[str, Any]], summary: dict[str, Any], wall_s: float,
                           warmup_epochs: int = 1) -> dict[str, Any]:
    """Per-run figures from the master worker's per-epoch records and the launcher's byte totals."""
    if not records:
        raise RuntimeError("the master worker left no metrics records")
    steps_total = int(records[-1]["steps"])
    # steps per epoch from the cumulative counter; epochs after the warm-up weigh by their step count
    previous = 0
    epochs = []
    for record in records:
        steps = int(record["steps"]) - previous
        previous = int(record["steps"])
        epochs.append((steps, float(record["step_ms"])))
    timed = epochs[warmup_epochs:] or epochs
    timed_steps = sum(s for s, _ in timed)
    step_ms = sum(s * ms for s, ms in timed) / max(timed_steps, 1)
    # steady-state WAN bytes per step from the global servers' counters between the first and last record
    steady = None
    if len(records) > 1 and records[-1]["steps"] > records[0]["steps"]:
        steady = (records[-1]["wan_mb"] - records[0]["wan_mb"]) * 1e6 / (records[-1]["steps"] - records[0]["steps"])
    wan_bytes = int(summary.get("wan_bytes", 0))
    return {
        "steps": steps_total,
        "epochs": len(records),
        "step_ms": step_ms,
        "step_ms_median_epoch": statistics.median(ms for _, ms in timed),
        "step_ms_all_epochs": sum(s * ms for s, ms in epochs) / max(sum(s for s, _ in epochs), 1),
        "step_ms_per_epoch": [ms for _, ms in epochs],
        "timed_steps": timed_steps,
        "wan_bytes_total": wan_bytes,
        "lan_bytes_total": int(summary.get("lan_bytes", 0)),
        "wan_bytes_per_step": wan_bytes / max(steps_total, 1),
        "wan_bytes_per_step_steady": steady,
        "test_accuracy": float(records[-1]["test_accuracy"]),
        "final_loss": float(records[-1]["loss"]),
        "train_s": float(records[-1]["elapsed_s"]),
        "wall_s": wall_s,
    }


def mean_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Average the numeric figures of repeated runs of one mode (a single run passes through)."""
    if len(runs) == 1:
        return dict(runs[0])
    merged: dict[str, Any] = {}
    for key in ("step_ms", "step_ms_median_epoch", "step_ms_all_epochs", "wan_bytes_per_step",
                "wan_bytes_per_step_steady", "test_accuracy", "final_loss", "train_s", "wall_s"):
        values = [r[key] for r in runs if r.get(key) is not None]
        merged[key] = statistics.fmean(values) if values else None
    merged["steps"] = runs[0]["steps"]
    merged["step_ms_runs"] = [r["step_ms"] for r in runs]
    return merged


def model_size(workload: Workload) -> int:
    """Parameters of the workload's DigitsCNN (the gradient a worker pushes per step is 4 bytes each)."""
    from ..zoo.models import DigitsCNN  # torch: only when the section runs

    return sum(p.numel() for p in DigitsCNN(channels=workload.channels, hidden=workload.hidden).parameters())


def training_ratios(flat: dict[str, Any], hips: dict[str, Any]) -> dict[str, Any]:
    """flat / HiPS for one workload (>1: HiPS is faster or sends less), and the accuracy difference."""
    return {
        "step_time_speedup": flat["step_ms"] / hips["step_ms"],
        "step_time_speedup_median_epoch": flat["step_ms_median_epoch"] / hips["step_ms_median_epoch"],
        "wan_bytes_reduction": flat["wan_bytes_per_step"] / hips["wan_bytes_per_step"],
        "wan_bytes_reduction_steady": (flat["wan_bytes_per_step_steady"] / hips["wan_bytes_per_step_steady"]
                                       if flat.get("wan_bytes_per_step_steady")
                                       and hips.get("wan_bytes_per_step_steady") else None),
        "accuracy_difference": hips["test_accuracy"] - flat["test_accuracy"],
        "wall_speedup": flat["wall_s"] / hips["wall_s"],
        "train_time_speedup": flat["train_s"] / hips["train_s"],
    }


def bench_workload(workload: Workload, repeats: int, cnn: Path, topologies: dict[str, Path], out_dir: Path,
                   errors: list[str]) -> dict[str, Any]:
    """Train one workload under the flat PS and under HiPS, ``repeats`` runs each; failures go to ``errors``."""
    parameters = model_size(workload)
    command = [sys.executable, str(cnn), *workload.cnn_args(), "--optimizer", "adam", "--seed", "0"]
    order: list[str] = []
    for repeat in range(repeats):
        order += ["flat", "hips"] if repeat % 2 == 0 else ["hips", "flat"]
    runs: dict[str, list[dict[str, Any]]] = {"flat": [], "hips": []}
    for index, mode in enumerate(order):
        name = f"training-{workload.name}-{mode}-{order[:index + 1].count(mode)}"
        say(f"[training] {name}: {workload.epochs} epochs of examples/cnn.py ({workload.label}) under "
            f"{'a flat PS' if mode == 'flat' else 'HiPS FSA'} (log: {out_dir / 'logs' / name}.log) ...")
        result, figures = measure("training", name, topologies[mode], command, out_dir, summarize_training_run,
                                  errors)
        if figures is None:
            continue
        runs[mode].append(figures)
        say(f"[training] {name}: {figures['steps']} steps, {figures['step_ms']:.1f} ms/step, "
            f"{figures['wan_bytes_per_step'] / 1e6:.3f} MB WAN/step, acc {figures['test_accuracy']:.4f}, "
            f"wall {result.wall_s:.1f} s")
    section: dict[str, Any] = {
        "job": {"workload": workload.name, "label": workload.label, "script": str(cnn), "command": command,
                "model": f"DigitsCNN(channels={workload.channels}, hidden={workload.hidden})",
                "parameters": parameters, "gradient_bytes_per_worker": 4 * parameters,
                "epochs": workload.epochs, "batch_size": workload.batch_size, "optimizer": "adam",
                "parties": 2, "workers_per_party": 2, "wan": WAN, "lan": LAN,
                "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "1 (launcher default)"),
                "warmup": "epoch 1 excluded from step_ms", "order": order},
        "runs": runs, "rows": {},
    }
    for mode in ("flat", "hips"):
        if runs[mode]:
            section["rows"][mode] = mean_runs(runs[mode])
    flat, hips = section["rows"].get("flat"), section["rows"].get("hips")
    if flat and hips:
        section["ratios"] = training_ratios(flat, hips)
    return section


def run(plan: BenchPlan, out_dir: Path) -> dict[str, Any]:
    """The section's entry point: every workload under both modes; the figures for bench.json."""
    cnn = find_examples() / "cnn.py"
    topo_dir = out_dir / "topologies"
    topologies = {mode: write_topology(topo_dir / f"training-{mode}.yaml", training_topology(mode))
                  for mode in ("flat", "hips")}
    warm_caches()
    errors: list[str] = []
    chosen, repeats = workloads(plan.quick)
    measured = {workload.name: bench_workload(workload, repeats, cnn, topologies, out_dir, errors)
                for workload in chosen}
    return {"workloads": measured, "errors": errors}


def lines(training: dict[str, Any]) -> list[str]:
    """The section's table for ``geomx bench``'s report."""
    measured = training.get("workloads", {})
    repeats = next((len(w["job"]["order"]) // 2 for w in measured.values()), None)
    out = [f"[training] examples/cnn.py, Adam, 2 parties x 2 workers, WAN {WAN['bandwidth']}/s {WAN['latency']} "
           f"one way, LAN {LAN['bandwidth']}/s {LAN['latency']}; {repeats} run(s) per mode and workload"]
    rows = []
    medians, steady = [], []
    for workload in measured.values():
        job, ratios = workload["job"], workload.get("ratios", {})
        steps = next((r["steps"] for r in workload["rows"].values()), None)
        out.append(f"  {job['label']}: {job['model']}, {job['parameters']:,} parameters "
                   f"({job['gradient_bytes_per_worker'] / 1e6:.2f} MB of gradients per worker), "
                   f"batch {job['batch_size']}, {steps} steps per run")
        for mode, label in (("flat", "flat PS"), ("hips", "HiPS FSA")):
            row = workload["rows"].get(mode)
            if not row:
                rows.append([job["label"], label, "failed", "-", "-", "-", "-", "-", "-"])
                continue
            is_flat = mode == "flat"
            rows.append([
                job["label"],
                label,
                fmt(row["step_ms"], ".1f"),
                "1.00x" if is_flat else fmt(ratios.get("step_time_speedup"), ".2f", "x"),
                fmt(row["wan_bytes_per_step"] / 1e6, ".3f"),
                "1.00x" if is_flat else fmt(ratios.get("wan_bytes_reduction"), ".2f", "x"),
                fmt(row["test_accuracy"], ".4f"),
                fmt(row["train_s"], ".1f"),
                fmt(row["wall_s"], ".1f"),
            ])
        if ratios.get("step_time_speedup_median_epoch"):
            medians.append(f"{job['label']} {ratios['step_time_speedup_median_epoch']:.2f}x")
        if ratios.get("wan_bytes_reduction_steady"):
            steady.append(f"{job['label']} {ratios['wan_bytes_reduction_steady']:.2f}x")
    out += table(["workload", "mode", "step ms", "speedup", "WAN MB/step", "WAN reduction", "test acc",
                  "train s", "wall s"], rows, left=2)
    out.append("note: step ms = mean over epochs 2..N (epoch 1 is warm-up), from the master worker's records; "
               "speedup and WAN reduction = flat / HiPS of the same workload;")
    out.append("      WAN MB/step = all WAN bytes sent by every process (incl. init and shutdown) / steps; "
               "train s = training loop time; wall s = launch to exit.")
    out.append("      small CNN: latency-bound, WAN-only bound on the speedup about 1.3x; wide CNN: bandwidth-bound, "
               "up to 2x less the local servers' CPU time (see benchmarks/README.md).")
    if medians:
        out.append(f"      speedup from the median epoch instead of the mean (robust to load bursts): "
                   f"{', '.join(medians)}.")
    if steady:
        out.append(f"      steady-state WAN reduction (global-server counters, epoch 1 to last): "
                   f"{', '.join(steady)}; expected 2.00x.")
    for error in training.get("errors", []):
        out.append(f"error: {error}")
    return out
