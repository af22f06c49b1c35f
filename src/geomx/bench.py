"""``geomx bench``: geomx measured against its baselines, side by side in one run.

Three sections (see ``benchmarks/README.md`` for how to read them):

* ``training`` — the digits CNN of ``examples/cnn.py`` (Adam on the global server) trained for the same
  number of steps under a flat parameter server and under HiPS (fully synchronous), both on the same
  emulated WAN: 2 parties x 2 workers, WAN 100 Mbit/s 25 ms one way, LAN 10 Gbit/s 0 ms. Two workloads:
  the small CNN (38k parameters, latency-bound on this WAN) and a wide one (1.6M parameters, 6.4 MB of
  gradients, bandwidth-bound). Ratios are to the flat PS of the same workload.
* ``transport`` — ``kv.pushpull`` of a 4 MB and a 100 MB float32 tensor between a worker and the global
  server on loopback (no emulation), against ``torch.distributed`` gloo ``all_reduce`` of the same tensor
  between 2 processes. Ratio geomx / gloo.
* ``sync`` — the small digits CNN on the training section's emulated WAN under every synchronization
  algorithm (flat-PS FSA, HiPS FSA, MixedSync, MixedSync + DCASGD, HFA, HFA + outer Nesterov, ESync), then
  FSA, MixedSync and ESync with one party (ESync: one worker) 3x slower: time to a target test accuracy,
  total WAN bytes and final accuracy, each against flat-PS FSA of the same scenario.

Nothing here asserts: the bench prints a table and writes every raw figure to ``OUT/bench.json``.
It returns 1 only when a measurement could not be taken (a run failed).

Usage::

    geomx bench --quick              # sync alone: 15 minutes on 2 cores at load average 21-33
    geomx bench --out bench-results  # the full run (sync alone: 37 minutes at load 17-45)
    geomx bench --only transport
    geomx bench --only sync
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from functools import partial
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from .launch import LaunchResult, launch
from .runlog import read_metrics

SECTIONS = ("training", "transport", "sync", "codecs", "frontend", "sched", "security", "wan")

# The emulated WAN of the training section (the demo topology's links).
WAN = {"bandwidth": "100Mbit", "latency": "25ms"}
LAN = {"bandwidth": "10Gbit", "latency": "0ms"}


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


@dataclass(frozen=True)
class SyncRow:
    """One run of the sync section: an example script with its flags, on a topology derived from the WAN job."""

    name: str  # its key in bench.json
    label: str  # its name in the table
    script: str  # in examples/: cnn.py, cnn_hfa.py or cnn_esync.py
    length: int  # epochs (cnn.py), global rounds (cnn_hfa.py) or rounds (cnn_esync.py)
    args: tuple[str, ...] = ()
    mode: str = "hips"  # the topology's mode
    hfa: tuple[int, int] | None = None  # the topology's hfa: (k1, k2)
    scenario: str = "same"  # "same": every worker at its own speed; "slow": one party (ESync: one worker) 3x
    # slower; "alone": dc1 joins and leaves at once, dc0 trains alone (MixedSync's fast-party baseline)

    @property
    def unit(self) -> str:
        """What ``length`` counts."""
        return {"cnn_esync.py": "rounds", "cnn_hfa.py": "global rounds"}.get(self.script, "epochs")

    def command(self, examples: Path, batch_size: int) -> list[str]:
        length_flag = "--" + self.unit.replace(" ", "-")
        return [sys.executable, str(examples / self.script), length_flag, str(self.length),
                "--batch-size", str(batch_size), "--seed", "0", *self.args]


@dataclass(frozen=True)
class Plan:
    """How much to run: --quick or the full bench."""

    workloads: tuple[Workload, ...]
    training_repeats: int  # runs per mode, alternated (flat, hips, hips, flat, ...) to cancel drift
    sizes_mb: tuple[float, ...]
    reps: int
    warmup: int
    two_workers: bool
    sync_rows: tuple[SyncRow, ...] = ()
    sync_batch_size: int = 32


# digits: 1437 training images / 4 workers = 359 per worker: 11 steps per epoch at batch 32, 5 at batch 64.
# The small CNN (38k parameters, 153 kB of gradients) is latency-bound on the emulated WAN; the wide one
# (1.6M parameters, 6.4 MB) is bandwidth-bound, about 1.5 s per flat-PS step, so it runs fewer steps: batch
# 64 keeps its warm-up epoch (excluded from step ms) at 5 steps.
SMALL_CNN = Workload("small", "small CNN", channels=16, hidden=64, batch_size=32, epochs=20)
WIDE_CNN = Workload("wide", "wide CNN", channels=32, hidden=1536, batch_size=64, epochs=6)

# The sync section's slowdowns: cnn.py slows a whole party (both dc1 workers), cnn_esync.py one worker (rank 3,
# in dc1). The section reads every worker's records: the master's (FSA, HFA, ESync: the global model after a
# global round) and, under MixedSync, each party's first worker's (each party's pulled model).
SLOW_PARTY = ("--slow-party", "dc1", "--slowdown", "3")
SLOW_RANK = ("--slow-rank", "3", "--slowdown", "3")
WIDE_ARGS = ("--channels", str(WIDE_CNN.channels), "--hidden", str(WIDE_CNN.hidden))
SYNC_BASELINE = "flat_fsa"  # flat-PS FSA: the ratios' denominator in its scenario and the source of the target


def sync_rows(quick: bool) -> tuple[SyncRow, ...]:
    """The sync section's runs: every algorithm at the same speed, then FSA, MixedSync and ESync with a slow party.

    Lengths (epochs; global rounds for HFA; rounds for ESync) are what each needs to reach flat-PS FSA's final
    accuracy minus 0.5 point with some margin (measured on 2 cores, batch 32: 11 steps per epoch): HFA with
    K1=20, K2=10 averages over the WAN every 200 local steps (18 epochs), and only its global model after a
    global round counts, so it runs a few global rounds (1000 local steps in 5); MixedSync + DCASGD runs SGD at
    lr 0.3 without momentum, the README's setting (with momentum 0.9 at lr 0.2, one run on a loaded machine
    diverged to chance accuracy in both parties and stayed there). --quick leaves out the
    slow HiPS FSA row (the slow flat-PS FSA row is the baseline) to stay near 3 minutes.
    """
    def n(full: int, short: int) -> int:
        return short if quick else full

    adam = ("--optimizer", "adam")
    same = (
        SyncRow(SYNC_BASELINE, "FSA, flat PS", "cnn.py", n(20, 10), adam, mode="flat"),
        SyncRow("hips_fsa", "FSA, HiPS", "cnn.py", n(20, 10), adam),
        SyncRow("mixedsync", "MixedSync (Adam)", "cnn.py", n(30, 15), ("--mixed-sync", *adam)),
        SyncRow("mixedsync_dcasgd", "MixedSync + DCASGD", "cnn.py", n(40, 15),
                ("--mixed-sync", "--dcasgd", "--lr", "0.3", "--momentum", "0")),
        SyncRow("hfa", "HFA K1=20 K2=10", "cnn_hfa.py", n(5, 3), hfa=(20, 10)),
        SyncRow("hfa_outer", "HFA K1=20 K2=10 + outer", "cnn_hfa.py", n(5, 3), ("--outer",), hfa=(20, 10)),
        SyncRow("esync", "ESync K1=4", "cnn_esync.py", n(40, 25), hfa=(4, 1)),
    )
    slowed = (SYNC_BASELINE, "mixedsync", "esync") if quick else (SYNC_BASELINE, "hips_fsa", "mixedsync", "esync")
    slow = tuple(replace(row, name=f"{row.name}_slow", scenario="slow",
                         args=(*row.args, *(SLOW_RANK if row.script == "cnn_esync.py" else SLOW_PARTY)))
                 for row in same if row.name in slowed)
    alone = tuple(replace(row, name=f"{row.name}_alone", scenario="alone", args=(*row.args, "--idle-party", "dc1"))
                  for row in same if row.name == "mixedsync")
    # The bandwidth-bound wide CNN (6.4 MB of gradients): where GeoMX's headline claim lives. Full bench only
    # (flat-PS FSA alone takes ~1.4 s a step, 2.5 minutes).
    wide = () if quick else tuple(
        replace(row, name=f"{row.name}_wide", scenario="wide", length=length, args=(*row.args, *WIDE_ARGS))
        for row, length in ((same[0], 10), (same[4], 3), (same[5], 3)))
    return same + slow + alone + wide


QUICK = Plan(workloads=(replace(SMALL_CNN, epochs=5), replace(WIDE_CNN, epochs=2)), training_repeats=1,
             sizes_mb=(4.0, 100.0), reps=10, warmup=2, two_workers=True, sync_rows=sync_rows(quick=True))
FULL = Plan(workloads=(SMALL_CNN, WIDE_CNN), training_repeats=2, sizes_mb=(4.0, 100.0), reps=30, warmup=3,
            two_workers=True, sync_rows=sync_rows(quick=False))


# ---------------------------------------------------------------------------------------------------------
# helpers

def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": _version("torch"),
        "numpy": _version("numpy"),
        "pyzmq": _version("pyzmq"),
        "geomx": _version("geomx"),
    }
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
    except Exception:  # torch missing or broken: the bench still reports what it can
        pass
    try:
        import zmq

        info["libzmq"] = zmq.zmq_version()
    except Exception:
        pass
    return info


def _load() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _write_topology(path: Path, raw: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _say(text: str) -> None:
    print(text, flush=True)


def _run_job(name: str, topology: Path, command: list[str],
             out_dir: Path) -> tuple[LaunchResult, dict[str, list[dict[str, Any]]]]:
    """Launch a whole topology locally; child output goes to OUT/logs/NAME.log. Returns (result, metrics)."""
    run_dir = out_dir / "runs" / name
    if run_dir.exists():
        shutil.rmtree(run_dir)  # metrics files are appended to: start clean
    log_path = out_dir / "logs" / f"{name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        result = launch(topology, command, run_dir=run_dir, out=log)
    if result.exit_code != 0 and result.failed is None:  # Ctrl-C: the launcher stopped the job
        raise KeyboardInterrupt
    metrics = read_metrics(run_dir)
    return result, metrics


def _measure(section: str, name: str, topology: Path, command: list[str], out_dir: Path,
             summarize: Callable[[list[dict[str, Any]], dict[str, Any], float], dict[str, Any]],
             errors: list[str],
             records_of: Callable[[dict[str, list[dict[str, Any]]]], list[dict[str, Any]]] | None = None,
             ) -> tuple[LaunchResult, dict[str, Any] | None]:
    """Run one job and summarize its records (default: the master worker's; ``records_of`` picks others);
    a failure is noted in ``errors`` (figures None)."""
    result, metrics = _run_job(name, topology, command, out_dir)
    if result.exit_code != 0:
        errors.append(f"{name} failed ({result.failed}); see {out_dir / 'logs' / name}.log")
        _say(f"[{section}] {name} FAILED ({result.failed})")
        return result, None
    try:
        figures = summarize((records_of or _master_records)(metrics), result.summary, result.wall_s)
    except (KeyError, ValueError, RuntimeError) as exc:
        errors.append(f"{name}: unreadable metrics records ({type(exc).__name__}: {exc})")
        _say(f"[{section}] {name}: unreadable metrics records: {exc}")
        return result, None
    figures["load_avg_after"] = _load()
    return result, figures


def _master_records(metrics: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The metric records of the one worker that records (the master worker)."""
    for name in sorted(metrics):
        if metrics[name]:
            return metrics[name]
    return []


def _all_records(metrics: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Every recording worker's records, in worker-name order (``dc0_worker0`` first), each with ``worker``."""
    return [{"worker": name, **record} for name in sorted(metrics) for record in metrics[name]]


# ---------------------------------------------------------------------------------------------------------
# training

def find_cnn_example() -> Path | None:
    """examples/cnn.py of the source checkout geomx runs from (editable install), or of the cwd."""
    here = Path(__file__).resolve()
    candidates = [here.parents[2] / "examples" / "cnn.py", Path.cwd() / "examples" / "cnn.py"]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    return None


def _warm_caches() -> None:
    """Import torch and load the digits once, untimed, so the first run does not pay a cold file cache."""
    code = "import torch, geomx.kv, geomx.data; geomx.data.digits_split()"
    with contextlib.suppress(subprocess.TimeoutExpired):
        subprocess.run([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=120, check=False)


def training_topology(mode: str) -> dict[str, Any]:
    return {
        "parties": {"dc0": {"workers": 2}, "dc1": {"workers": 2}},
        "central": "dc0",
        "global_servers": 1,
        "mode": mode,
        "links": {"lan": dict(LAN), "wan": dict(WAN)},
    }


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


def _mean_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
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
    from .models import DigitsCNN

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
        _say(f"[training] {name}: {workload.epochs} epochs of examples/cnn.py ({workload.label}) under "
             f"{'a flat PS' if mode == 'flat' else 'HiPS FSA'} (log: {out_dir / 'logs' / name}.log) ...")
        result, figures = _measure("training", name, topologies[mode], command, out_dir, summarize_training_run,
                                   errors)
        if figures is None:
            continue
        runs[mode].append(figures)
        _say(f"[training] {name}: {figures['steps']} steps, {figures['step_ms']:.1f} ms/step, "
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
            section["rows"][mode] = _mean_runs(runs[mode])
    flat, hips = section["rows"].get("flat"), section["rows"].get("hips")
    if flat and hips:
        section["ratios"] = training_ratios(flat, hips)
    return section


def bench_training(plan: Plan, out_dir: Path) -> dict[str, Any]:
    cnn = find_cnn_example()
    if cnn is None:
        raise RuntimeError("examples/cnn.py not found: run geomx bench from a geomx source checkout "
                           "(pip install -e .) or from its root folder")
    topo_dir = out_dir / "topologies"
    topologies = {mode: _write_topology(topo_dir / f"training-{mode}.yaml", training_topology(mode))
                  for mode in ("flat", "hips")}
    _warm_caches()
    errors: list[str] = []
    workloads = {workload.name: bench_workload(workload, plan.training_repeats, cnn, topologies, out_dir, errors)
                 for workload in plan.workloads}
    return {"workloads": workloads, "errors": errors}


# ---------------------------------------------------------------------------------------------------------
# transport

def transport_topology(workers: int) -> dict[str, Any]:
    """One party, one global server, flat: the worker(s) talk straight to the global server, no emulation."""
    return {"parties": {"dc0": {"workers": workers}}, "central": "dc0", "global_servers": 1, "mode": "flat"}


def bench_geomx_pushpull(plan: Plan, out_dir: Path, workers: int) -> list[dict[str, Any]]:
    topology = _write_topology(out_dir / "topologies" / f"transport-{workers}w.yaml", transport_topology(workers))
    command = [sys.executable, "-m", "geomx.bench_workers.transport", "--sizes-mb",
               *[f"{s:g}" for s in plan.sizes_mb], "--reps", str(plan.reps), "--warmup", str(plan.warmup)]
    name = f"transport-geomx-{workers}w"
    _say(f"[transport] {name}: pushpull of {', '.join(f'{s:g} MB' for s in plan.sizes_mb)} "
         f"x{plan.reps} ({workers} worker{'s' if workers > 1 else ''} + 1 global server) ...")
    result, metrics = _run_job(name, topology, command, out_dir)
    if result.exit_code != 0:
        raise RuntimeError(f"{name} failed ({result.failed}); see {out_dir / 'logs' / name}.log")
    records = _master_records(metrics)
    if len(records) != len(plan.sizes_mb):
        raise RuntimeError(f"{name}: expected {len(plan.sizes_mb)} records, got {len(records)}")
    for record in records:
        record["wall_s"] = result.wall_s
    return records


def bench_gloo(plan: Plan, out_dir: Path, world: int = 2, timeout_s: float = 300.0) -> list[dict[str, Any]]:
    _say(f"[transport] gloo all_reduce of {', '.join(f'{s:g} MB' for s in plan.sizes_mb)} x{plan.reps} "
         f"({world} processes) ...")
    out_file = out_dir / "runs" / "transport-gloo.json"
    out_file.parent.mkdir(parents=True, exist_ok=True)
    out_file.unlink(missing_ok=True)
    port = _free_port()
    log_path = out_dir / "logs" / "transport-gloo.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    procs = []
    with open(log_path, "w") as log:
        for rank in range(world):
            argv = [sys.executable, "-m", "geomx.bench_workers.gloo", "--rank", str(rank), "--world", str(world),
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
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        codes = [p.returncode for p in procs]
    if any(codes) or not out_file.is_file():
        raise RuntimeError(f"gloo all_reduce failed (exit codes {codes}); see {log_path}")
    return list(json.loads(out_file.read_text()))


def bench_transport(plan: Plan, out_dir: Path) -> dict[str, Any]:
    section: dict[str, Any] = {
        "setup": {"sizes_mb": list(plan.sizes_mb), "reps": plan.reps, "warmup": plan.warmup,
                  "geomx": "flat topology, 1 party, 1 global server, links unlimited (loopback TCP); "
                           "kv.pushpull(key, value, out=out); default slice_elems (1M elements)",
                  "gloo": "torch.distributed gloo all_reduce, 2 processes, tcp:// on 127.0.0.1",
                  "gbps": "tensor bytes / mean time per operation, 1 GB = 1e9 bytes"},
        "errors": [],
    }
    measured: dict[str, list[dict[str, Any]]] = {}
    jobs = [("geomx_1w", lambda: bench_geomx_pushpull(plan, out_dir, 1)),
            ("gloo_2p", lambda: bench_gloo(plan, out_dir, 2))]
    if plan.two_workers:
        jobs.append(("geomx_2w", lambda: bench_geomx_pushpull(plan, out_dir, 2)))
    for label, job in jobs:
        try:
            measured[label] = job()
            for entry in measured[label]:
                _say(f"[transport] {label} {entry['size_mb']:g} MB: {entry['mean_s'] * 1000:.1f} ms/op, "
                     f"{entry['gbps']:.3f} GB/s")
        except Exception as exc:  # record and go on: the other measurements still count
            section["errors"].append(f"{label}: {exc}")
            _say(f"[transport] {label} FAILED: {exc}")
    section["raw"] = measured
    rows = []
    for index, size in enumerate(plan.sizes_mb):
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
    section["rows"] = rows
    return section


# ---------------------------------------------------------------------------------------------------------
# sync

SYNC_FIXED_TARGET = 0.90  # the target when the baseline did not run
SYNC_TARGET_MARGIN = 0.005  # the target is the baseline's final accuracy minus 0.5 point


def sync_topology(row: SyncRow) -> dict[str, Any]:
    """The training section's WAN job in the row's mode, with its HFA settings.

    MixedSync's fast party leaves when it is done (the global tier lets clients leave one by one), so no
    patient shutdown timeout is needed for the slow-party rows.
    """
    raw = training_topology(row.mode)
    if row.hfa is not None:
        raw["hfa"] = {"k1": row.hfa[0], "k2": row.hfa[1]}
    return raw


def _curve(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"steps": int(r["steps"]), "test_accuracy": float(r["test_accuracy"]), "elapsed_s": float(r["elapsed_s"]),
             "wan_mb": r.get("wan_mb"), "global_round": r.get("global_round")} for r in records]


def summarize_sync_run(records: list[dict[str, Any]], summary: dict[str, Any], wall_s: float) -> dict[str, Any]:
    """Per-run figures and each party's accuracy curve from the records (one per epoch or round).

    ``records`` come from every recording worker, grouped by their ``party`` (a record without one belongs to
    party ""); the first party met is the master's (``dc0_worker0`` sorts first): ``steps``, ``train_s`` and
    ``curve`` are its. ``test_accuracy`` is the lowest of the parties' last records (MixedSync: the worst
    party's final model). Usage: ``summarize_sync_run(_all_records(metrics), result.summary, result.wall_s)``.
    """
    if not records:
        raise RuntimeError("no worker left metrics records")
    by_party: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        by_party.setdefault(str(record.get("party", "")), []).append(record)
    parties = {party: {"curve": _curve(recs), "steps": int(recs[-1]["steps"]),
                       "test_accuracy": float(recs[-1]["test_accuracy"]), "train_s": float(recs[-1]["elapsed_s"])}
               for party, recs in by_party.items()}
    master = parties[next(iter(parties))]
    curves = [c for p in parties.values() for c in p["curve"]]
    return {
        "records": len(records),
        "steps": master["steps"],
        "test_accuracy": min(p["test_accuracy"] for p in parties.values()),
        "best_accuracy": max(c["test_accuracy"] for c in curves),
        "train_s": master["train_s"],
        "wall_s": wall_s,
        "wan_bytes_total": int(summary.get("wan_bytes", 0)),
        "lan_bytes_total": int(summary.get("lan_bytes", 0)),
        "curve": master["curve"],
        "parties": parties,
    }


def first_at_target(curve: list[dict[str, Any]], target: float) -> int | None:
    """Index of the first point at or above ``target`` that was taken after a global round, else None.

    A point with ``global_round`` 0 (or below) evaluated a model no global average had touched yet (HFA's
    local models before the first WAN exchange): it does not count. A point without ``global_round`` (a
    script that does not say) counts as it is.
    """
    for index, point in enumerate(curve):
        rounds = point.get("global_round")
        if rounds is not None and rounds < 1:
            continue
        if point["test_accuracy"] >= target - 1e-9:
            return index
    return None


NOT_REACHED = {"reached": False, "time_to_target_s": None, "steps_to_target": None, "global_rounds_to_target": None,
               "wan_bytes_to_target": None, "wan_bytes_to_target_estimated": False}


def reach_target(figures: dict[str, Any], target: float) -> dict[str, Any]:
    """When the job reached ``target``: the SLOWEST party's first point at target (see ``first_at_target``).

    Returns its elapsed seconds, steps, global rounds and WAN bytes by then, which party it was, and every
    party's time. A party that recorded but never reached the target: not reached. The WAN bytes come from
    the point's ``wan_mb`` (every WAN byte of the job so far, read from the global servers); for a script
    that records none, the launcher's total pro rata by that party's records, marked estimated.
    """
    parties = figures.get("parties") or {"": {"curve": figures["curve"]}}
    hits = {party: first_at_target(p["curve"], target) for party, p in parties.items()}
    missing = sorted(party for party, index in hits.items() if index is None)
    if missing:
        return {**NOT_REACHED, "not_reached_by": missing}
    times = {party: parties[party]["curve"][index]["elapsed_s"] for party, index in hits.items()}
    slowest = max(times, key=lambda party: times[party])
    curve, index = parties[slowest]["curve"], hits[slowest]
    point = curve[index]
    estimated = point.get("wan_mb") is None
    wan = (figures["wan_bytes_total"] * (index + 1) / len(curve)) if estimated else point["wan_mb"] * 1e6
    return {"reached": True, "time_to_target_s": point["elapsed_s"], "steps_to_target": point["steps"],
            "global_rounds_to_target": point.get("global_round"), "records_to_target": index + 1,
            "wan_bytes_to_target": wan, "wan_bytes_to_target_estimated": estimated, "slowest_party": slowest,
            "party_time_to_target_s": times}


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    return numerator / denominator if numerator is not None and denominator else None


def sync_ratios(base: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    """Baseline / row (>1: the row is faster or sends less), and the accuracy difference row - baseline."""
    return {
        "time_to_target_speedup": _ratio(base.get("time_to_target_s"), row.get("time_to_target_s")),
        "wan_bytes_reduction": _ratio(base["wan_bytes_total"], row["wan_bytes_total"]),
        "wan_bytes_to_target_reduction": _ratio(base.get("wan_bytes_to_target"), row.get("wan_bytes_to_target")),
        "accuracy_difference": row["test_accuracy"] - base["test_accuracy"],
    }


def bench_sync(plan: Plan, out_dir: Path) -> dict[str, Any]:
    """Run every row of ``plan.sync_rows``, then rate each against flat-PS FSA of its scenario."""
    cnn = find_cnn_example()
    if cnn is None:
        raise RuntimeError("examples/ not found: run geomx bench from a geomx source checkout "
                           "(pip install -e .) or from its root folder")
    examples = cnn.parent
    _warm_caches()
    errors: list[str] = []
    jobs: dict[str, dict[str, Any]] = {}
    rows: dict[str, dict[str, Any]] = {}
    for row in plan.sync_rows:
        name = f"sync-{row.name}"
        topology = _write_topology(out_dir / "topologies" / f"{name}.yaml", sync_topology(row))
        command = row.command(examples, plan.sync_batch_size)
        jobs[row.name] = {**asdict(row), "command": command, "topology": str(topology)}
        _say(f"[sync] {name}: {row.label}, {row.length} {row.unit} "
             f"of examples/{' '.join((row.script, *row.args))} (log: {out_dir / 'logs' / name}.log) ...")
        result, figures = _measure("sync", name, topology, command, out_dir, summarize_sync_run, errors,
                                   records_of=_all_records)
        if figures is None:
            continue
        if any(c["global_round"] is None for p in figures["parties"].values() for c in p["curve"]):
            errors.append(f"{name}: examples/{row.script} left records without global_round: "
                          "its time to target cannot tell local models from global ones")
        rows[row.name] = figures
        _say(f"[sync] {name}: {figures['steps']} steps, acc {figures['test_accuracy']:.4f}, "
             f"WAN {figures['wan_bytes_total'] / 1e6:.2f} MB, train {figures['train_s']:.1f} s, "
             f"wall {result.wall_s:.1f} s")
    baseline = rows.get(SYNC_BASELINE)
    if baseline is not None:
        target = baseline["test_accuracy"] - SYNC_TARGET_MARGIN
        rule = f"flat-PS FSA's final test accuracy ({baseline['test_accuracy']:.4f}) minus 0.5 point"
    else:
        target, rule = SYNC_FIXED_TARGET, f"fixed {SYNC_FIXED_TARGET:.2f} (flat-PS FSA did not run)"
    # A different model has a target of its own: its flat-PS FSA's final accuracy minus 0.5 point.
    wide_base = rows.get(f"{SYNC_BASELINE}_wide")
    if baseline is None and not any(r.scenario != "wide" for r in plan.sync_rows):
        rule = "the small CNN did not run (--scenario wide): see the wide CNN's target below"
    targets = {} if wide_base is None else {"wide": wide_base["test_accuracy"] - SYNC_TARGET_MARGIN}
    for row in plan.sync_rows:
        if row.name not in rows:
            continue
        figures = rows[row.name]
        figures["target_accuracy"] = targets.get(row.scenario, target)
        figures.update(reach_target(figures, figures["target_accuracy"]))
        figures["time_to_090_s"] = reach_target(figures, 0.90)["time_to_target_s"]
        base = rows.get(SYNC_BASELINE if row.scenario == "same" else f"{SYNC_BASELINE}_{row.scenario}")
        if base is not None:
            figures["ratios"] = sync_ratios(base, figures)
    return {"target_accuracy": target, "target_rule": rule, "targets": targets, "batch_size": plan.sync_batch_size,
            "parties": 2, "workers_per_party": 2, "wan": WAN, "lan": LAN, "jobs": jobs, "rows": rows,
            "goals": sync_goals(rows), "errors": errors}


def sync_goals(rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The issue's goals, measured (reported, never asserted)."""
    goals: dict[str, Any] = {}
    for suffix in ("", "_wide"):
        outer, flat = rows.get(f"hfa_outer{suffix}"), rows.get(f"{SYNC_BASELINE}{suffix}")
        if outer and flat:
            speedup = outer.get("ratios", {}).get("time_to_target_speedup")
            loss = flat["test_accuracy"] - outer["test_accuracy"]
            goals[f"hfa_outer{suffix}"] = {"time_to_target_speedup": speedup, "accuracy_loss": loss,
                                           "speedup_20x": bool(speedup and speedup >= 20),
                                           "speedup_50x": bool(speedup and speedup >= 50),
                                           "accuracy_loss_le_0.5pt": loss <= SYNC_TARGET_MARGIN + 1e-9}
    fsa = [rows[n] for n in (f"{SYNC_BASELINE}_slow", "hips_fsa_slow") if n in rows]
    alone, with_slow = rows.get("mixedsync_alone"), rows.get("mixedsync_slow")
    if alone and with_slow:
        rates = [r["steps"] / r["train_s"] if r["train_s"] > 0 else None for r in (alone, with_slow)]
        ratio = _ratio(rates[1], rates[0])
        goals["mixedsync_fast_party"] = {"alone_steps_per_s": rates[0], "with_slow_party_steps_per_s": rates[1],
                                         "ratio": ratio, "within_10pct": bool(ratio is not None and ratio >= 0.9)}
    for name in ("mixedsync_slow", "esync_slow"):
        if name in rows and fsa:
            time = rows[name].get("time_to_target_s")
            fsa_times = [f.get("time_to_target_s") for f in fsa]
            goals[name] = {"time_to_target_s": time, "fsa_time_to_target_s": fsa_times,
                           "fsa_rows": [n for n in (f"{SYNC_BASELINE}_slow", "hips_fsa_slow") if n in rows],
                           "beats_fsa": bool(time is not None and all(t is None or time < t for t in fsa_times))}
    return goals


# ---------------------------------------------------------------------------------------------------------
# the table

def _fmt(value: Any, spec: str, suffix: str = "") -> str:
    if value is None:
        return "-"
    return f"{value:{spec}}{suffix}"


def _table(headers: list[str], rows: list[list[str]], left: int = 1) -> list[str]:
    """Plain-text columns: the first ``left`` left-aligned, the others right-aligned."""
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i < left else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True)))

    return [line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)]


def _training_lines(training: dict[str, Any]) -> list[str]:
    workloads = training.get("workloads", {})
    repeats = next((len(w["job"]["order"]) // 2 for w in workloads.values()), None)
    lines = [f"[training] examples/cnn.py, Adam, 2 parties x 2 workers, WAN {WAN['bandwidth']}/s {WAN['latency']} "
             f"one way, LAN {LAN['bandwidth']}/s {LAN['latency']}; {repeats} run(s) per mode and workload"]
    rows = []
    medians, steady = [], []
    for workload in workloads.values():
        job, ratios = workload["job"], workload.get("ratios", {})
        steps = next((r["steps"] for r in workload["rows"].values()), None)
        lines.append(f"  {job['label']}: {job['model']}, {job['parameters']:,} parameters "
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
                _fmt(row["step_ms"], ".1f"),
                "1.00x" if is_flat else _fmt(ratios.get("step_time_speedup"), ".2f", "x"),
                _fmt(row["wan_bytes_per_step"] / 1e6, ".3f"),
                "1.00x" if is_flat else _fmt(ratios.get("wan_bytes_reduction"), ".2f", "x"),
                _fmt(row["test_accuracy"], ".4f"),
                _fmt(row["train_s"], ".1f"),
                _fmt(row["wall_s"], ".1f"),
            ])
        if ratios.get("step_time_speedup_median_epoch"):
            medians.append(f"{job['label']} {ratios['step_time_speedup_median_epoch']:.2f}x")
        if ratios.get("wan_bytes_reduction_steady"):
            steady.append(f"{job['label']} {ratios['wan_bytes_reduction_steady']:.2f}x")
    lines += _table(["workload", "mode", "step ms", "speedup", "WAN MB/step", "WAN reduction", "test acc",
                     "train s", "wall s"], rows, left=2)
    lines.append("note: step ms = mean over epochs 2..N (epoch 1 is warm-up), from the master worker's records; "
                 "speedup and WAN reduction = flat / HiPS of the same workload;")
    lines.append("      WAN MB/step = all WAN bytes sent by every process (incl. init and shutdown) / steps; "
                 "train s = training loop time; wall s = launch to exit.")
    lines.append("      small CNN: latency-bound, WAN-only bound on the speedup about 1.3x; wide CNN: bandwidth-bound, "
                 "up to 2x less the local servers' CPU time (see benchmarks/README.md).")
    if medians:
        lines.append(f"      speedup from the median epoch instead of the mean (robust to load bursts): "
                     f"{', '.join(medians)}.")
    if steady:
        lines.append(f"      steady-state WAN reduction (global-server counters, epoch 1 to last): "
                     f"{', '.join(steady)}; expected 2.00x.")
    for error in training.get("errors", []):
        lines.append(f"error: {error}")
    return lines


SCENARIOS = {"same": "same speed", "slow": "1 slow (3x)", "alone": "dc0 alone", "wide": "wide CNN"}


def _sync_lines(sync: dict[str, Any]) -> list[str]:
    rows, jobs = sync.get("rows", {}), sync.get("jobs", {})
    lines = [f"[sync] the small CNN (examples/cnn*.py), 2 parties x 2 workers, WAN {WAN['bandwidth']}/s "
             f"{WAN['latency']} one way, LAN {LAN['bandwidth']}/s {LAN['latency']}, batch {sync['batch_size']}; "
             + (f"target test accuracy {sync['target_accuracy']:.4f}" if any(
                 j["scenario"] != "wide" for j in sync.get("jobs", {}).values()) else "the wide CNN's target below")]
    table = []
    for name, job in jobs.items():
        row = rows.get(name)
        scenario = SCENARIOS.get(job["scenario"], job["scenario"])
        if row is None:
            table.append([scenario, job["label"], "failed", *["-"] * 11])
            continue
        ratios = row.get("ratios", {})
        is_base = name.startswith(SYNC_BASELINE)
        wan_to = row.get("wan_bytes_to_target")
        table.append([
            scenario,
            job["label"],
            str(row["steps"]),
            _fmt(row.get("time_to_target_s"), ".2f") if row.get("reached") else "not reached",
            _fmt(row.get("global_rounds_to_target"), "d"),
            "1.00x" if is_base else _fmt(ratios.get("time_to_target_speedup"), ".2f", "x"),
            _fmt(row["test_accuracy"], ".4f"),
            "base" if is_base else _fmt(100 * ratios["accuracy_difference"], "+.2f") if ratios else "-",
            _fmt(row["wan_bytes_total"] / 1e6, ".2f"),
            "1.00x" if is_base else _fmt(ratios.get("wan_bytes_reduction"), ".1f", "x"),
            ("~" if row.get("wan_bytes_to_target_estimated") else "") + _fmt(None if wan_to is None else wan_to / 1e6,
                                                                              ".2f"),
            "1.00x" if is_base else _fmt(ratios.get("wan_bytes_to_target_reduction"), ".1f", "x"),
            _fmt(row["train_s"], ".1f"),
            _fmt(row["wall_s"], ".1f"),
        ])
    lines += _table(["scenario", "algorithm", "steps", "to target s", "rounds @target", "speedup", "final acc",
                     "d acc pt", "WAN MB", "WAN red.", "WAN MB @target", "red. @target", "train s", "wall s"],
                    table, left=2)
    lines.append(f"note: target = {sync['target_rule']}; only the job's model counts: FSA, HFA, ESync: the global "
                 "model after a global round (HFA: evaluated every K1 x K2 = 200")
    lines.append("      local steps, never a party's local model); MixedSync (+ DCASGD): each party's pulled model, "
                 "and to target s is the SLOWEST party's (its first record at target,")
    lines.append("      its own training-loop time); a record before the first global round does not count. "
                 "rounds @target = global rounds (WAN exchanges) by then: steps for FSA and")
    lines.append("      MixedSync (that party's), global averages for HFA, rounds for ESync. speedup, WAN red(uction) "
                 "= flat-PS FSA of the same scenario / the row;")
    lines.append("      final acc = the lowest of the parties' last records; d acc pt = final acc minus that FSA's, in "
                 "points; steps = the master's (local steps for HFA, ESync);")
    lines.append("      WAN MB = the launcher's total (whole run); @target = the job's WAN bytes at the target record "
                 "(~: no wan_mb recorded, total pro rata by records); train s = the")
    lines.append("      master's loop time, wall s = launch to exit. 1 slow (3x): cnn.py --slow-party dc1 --slowdown 3 "
                 "(both dc1 workers); cnn_esync.py --slow-rank 3 --slowdown 3 (one dc1 worker).")
    if "wide" in sync.get("targets", {}):
        lines.append(f"      wide CNN: --channels {WIDE_CNN.channels} --hidden {WIDE_CNN.hidden} (bandwidth-bound); "
                     f"its target is its own flat-PS FSA's final accuracy minus 0.5 point: "
                     f"{sync['targets']['wide']:.4f}.")
    goals = sync.get("goals", {})
    for name, model in (("hfa_outer", "small CNN"), ("hfa_outer_wide", "wide CNN")):
        outer = goals.get(name)
        if not outer:
            continue
        speedup = outer["time_to_target_speedup"]
        lines.append(f"goals ({model}): HFA + outer reaches the target {_fmt(speedup, '.1f', 'x')} sooner than "
                     "flat-PS FSA "
                     f"(goal >= 20x: {'met' if outer['speedup_20x'] else 'not met'}; stretch >= 50x: "
                     f"{'met' if outer['speedup_50x'] else 'not met'}); its final accuracy is "
                     f"{-100 * outer['accuracy_loss']:+.2f} pt against FSA's (goal: loss <= 0.5 pt: "
                     f"{'met' if outer['accuracy_loss_le_0.5pt'] else 'not met'}).")
    fast = goals.get("mixedsync_fast_party")
    if fast:
        lines.append(f"       MixedSync fast party (dc0): {_fmt(fast['with_slow_party_steps_per_s'], '.2f')} steps/s "
                     f"beside a 3x slower dc1, {_fmt(fast['alone_steps_per_s'], '.2f')} alone (dc1 idle): "
                     f"{_fmt(fast['ratio'], '.2f', 'x')} "
                     f"(goal >= 0.90x: {'met' if fast['within_10pct'] else 'not met'}).")
    for name, label in (("mixedsync_slow", "MixedSync"), ("esync_slow", "ESync")):
        goal = goals.get(name)
        if goal:
            fsa = ", ".join(f"{'HiPS' if n.startswith('hips') else 'flat PS'} "
                            + ("not reached" if t is None else f"{t:.2f} s")
                            for n, t in zip(goal["fsa_rows"], goal["fsa_time_to_target_s"], strict=True))
            lines.append(f"       1 slow (3x): {label} {_fmt(goal['time_to_target_s'], '.2f', ' s')} to target "
                         f"against FSA ({fsa}): {'beats' if goal['beats_fsa'] else 'does not beat'} FSA.")
    for error in sync.get("errors", []):
        lines.append(f"error: {error}")
    return lines


def format_report(report: dict[str, Any]) -> str:
    machine = report["machine"]
    lines = ["", f"=== geomx bench ({'quick' if report['quick'] else 'full'}) === "
             f"{machine.get('cores')} cores, torch {machine.get('torch')}, python {machine.get('python')}, "
             f"load avg at start {report.get('load_avg_start')}"]
    cores = machine.get("cores") or 1
    load = report.get("load_avg_start")
    if load and load[0] > 0.75 * cores:
        lines.append(f"warning: the machine was already busy (1-min load {load[0]} on {cores} cores): "
                     "times and their ratios are noisy; compare medians in bench.json")
    training = report.get("training")
    if training:
        lines += ["", *_training_lines(training)]
    elif "training_error" in report:
        lines += ["", f"[training] not measured: {report['training_error']}"]
    transport = report.get("transport")
    if transport:
        setup = transport["setup"]
        lines += ["", f"[transport] loopback, no emulation; {setup['reps']} timed ops after {setup['warmup']} "
                      "warm-up; GB/s = tensor bytes / time per op"]
        rows = []
        for row in transport.get("rows", []):
            rows.append([f"{row['size_mb']:g} MB",
                         _fmt(row.get("geomx_1w_gbps"), ".3f"), _fmt(row.get("gloo_2p_gbps"), ".3f"),
                         _fmt(row.get("geomx_1w_over_gloo"), ".2f", "x"),
                         _fmt(row.get("geomx_2w_gbps"), ".3f"), _fmt(row.get("geomx_2w_over_gloo"), ".2f", "x")])
        lines += _table(["tensor", "geomx 1w GB/s", "gloo 2p GB/s", "geomx/gloo", "geomx 2w GB/s",
                         "geomx 2w/gloo"], rows)
        lines.append("note: geomx = kv.pushpull worker <-> global server (flat, 1 party; 2w: two workers, "
                     "3 processes); gloo = all_reduce between 2 processes; goal geomx/gloo >= 1.0.")
        medians = [f"{row['size_mb']:g} MB {row['geomx_1w_over_gloo_median']:.2f}x"
                   + (f" (2w {row['geomx_2w_over_gloo_median']:.2f}x)" if "geomx_2w_over_gloo_median" in row else "")
                   for row in transport.get("rows", []) if "geomx_1w_over_gloo_median" in row]
        if medians:
            lines.append(f"      geomx/gloo from median times (robust to load bursts): {', '.join(medians)}.")
        for error in transport.get("errors", []):
            lines.append(f"error: {error}")
    elif "transport_error" in report:
        lines += ["", f"[transport] not measured: {report['transport_error']}"]
    sync = report.get("sync")
    if sync:
        lines += ["", *_sync_lines(sync)]
    elif "sync_error" in report:
        lines += ["", f"[sync] not measured: {report['sync_error']}"]
    if report.get("codecs"):  # the section lives in bench_codecs.py
        from .bench_codecs import codecs_lines
        lines += ["", *codecs_lines(report["codecs"])]
    elif "codecs_error" in report:
        lines += ["", f"[codecs] not measured: {report['codecs_error']}"]
    if report.get("sched"):  # the section lives in bench_sched.py
        from .bench_sched import sched_lines
        lines += sched_lines(report["sched"])
    if report.get("frontend"):  # the section lives in bench_frontend.py
        from .bench_frontend import frontend_lines
        lines += ["", *frontend_lines(report["frontend"])]
    elif "frontend_error" in report:
        lines += ["", f"[frontend] not measured: {report['frontend_error']}"]
    if report.get("security"):  # the section lives in bench_security.py
        from .bench_security import security_lines
        lines += ["", *security_lines(report["security"])]
    elif "security_error" in report:
        lines += ["", f"[security] not measured: {report['security_error']}"]
    if report.get("wan"):  # the section lives in bench_wan.py
        from .bench_wan import wan_lines
        lines += ["", *wan_lines(report["wan"])]
    lines.append("")
    lines.append(f"raw figures: {report.get('json_path')}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------
# entry point

def _bench_codecs(plan: Plan, out_dir: Path) -> dict[str, Any]:
    from .bench_codecs import bench_codecs
    return bench_codecs(plan is QUICK, out_dir)


def _bench_frontend(plan: Plan, out_dir: Path) -> dict[str, Any]:
    from .bench_frontend import run_frontend
    return run_frontend(plan is QUICK, out_dir)


def _bench_sched(plan: Plan, out_dir: Path) -> dict[str, Any]:
    from .bench_sched import bench_sched  # MultiGPS and DGT (the module imports this one)
    return bench_sched(plan is QUICK, out_dir)


def _bench_security(plan: Plan, out_dir: Path) -> dict[str, Any]:
    from .bench_security import run_security
    return run_security(plan is QUICK, out_dir)


def _bench_wan(plan: Plan, out_dir: Path, job: str | None = None) -> dict[str, Any]:
    from .bench_wan import jobs_from, run_wan  # needs root: namespaces joined by a tbf-shaped veth
    return run_wan(plan is QUICK, out_dir, jobs=jobs_from(job))


def bench_plan(quick: bool, sync_scenarios: list[str] | None = None) -> Plan:
    """QUICK or FULL, with only the sync rows of ``sync_scenarios`` if given. Usage: ``bench_plan(False, ["wide"])``."""
    plan = QUICK if quick else FULL
    if not sync_scenarios:
        return plan
    return replace(plan, sync_rows=tuple(r for r in plan.sync_rows if r.scenario in sync_scenarios))


def run_bench(quick: bool, out_dir: Path, sections: list[str] | None = None,
              sync_scenarios: list[str] | None = None, wan_job: str | None = None) -> int:
    """Run the chosen sections (default: all), print the table, write OUT/bench.json. Never asserts.

    ``sync_scenarios``: run only those scenarios' rows of the sync section (e.g. ``["wide"]``: the bandwidth-bound
    CNN's flat-PS FSA, HFA and HFA + outer, ~4 minutes); ``wan_job``: the wan section's job (mlp, lm, all).
    """
    plan = bench_plan(quick, sync_scenarios)
    chosen = [s for s in SECTIONS if (s in sections if sections else s != "wan")]  # wan: only on request
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / "bench.json"
    started = time.monotonic()
    report: dict[str, Any] = {
        "quick": quick, "sections": chosen, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine_info(), "load_avg_start": _load(), "plan": asdict(plan), "json_path": str(json_path),
    }
    failed = False
    interrupted = False
    for section, runner in (("training", bench_training), ("transport", bench_transport), ("sync", bench_sync),
                            ("codecs", _bench_codecs),
                            ("frontend", _bench_frontend), ("sched", _bench_sched),
                            ("security", _bench_security), ("wan", partial(_bench_wan, job=wan_job))):
        if section not in chosen:
            continue
        try:
            report[section] = runner(plan, out_dir)
            failed = failed or bool(report[section].get("errors"))
        except KeyboardInterrupt:
            interrupted = True
            report[f"{section}_error"] = "interrupted"
            _say(f"[{section}] interrupted; writing what was measured so far")
            break
        except Exception as exc:
            failed = True
            report[f"{section}_error"] = f"{type(exc).__name__}: {exc}"
            report[f"{section}_traceback"] = traceback.format_exc()
            _say(f"[{section}] not measured: {exc}")
    report["load_avg_end"] = _load()
    report["bench_wall_s"] = time.monotonic() - started
    json_path.write_text(json.dumps(report, indent=2, default=str))
    _say(format_report(report))
    _say(f"bench wall time: {report['bench_wall_s']:.0f} s")
    return 130 if interrupted else 1 if failed else 0
