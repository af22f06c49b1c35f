"""``geomx bench``'s front-end section: does the PyTorch wrapper overlap, and what do P3's two halves add?

2 parties x 1 worker, synthetic inputs, WAN latency 25 ms. Three groups of jobs:

- overlap (CommBoundCNN, 1.1M parameters, its 1M-element dense layer deepest; 1 Gbit/s WAN, batch 64,
  backward and communication of similar length): ``sequential`` is the kvstore loop (backward, then push
  all, then pull all) and ``wrapper`` the same model and server optimizer through
  ``geomx.torch.DistributedOptimizer``;
- P3 on CommBoundCNN (100 Mbit/s WAN, batch 16, communication-bound) and on DeepCNN (six small
  convolutions, then 1.3M dense weights last: P3's favourable case), each as:
  ``p3`` (50K-element slices, priority ``-layer``: P3), ``slices_fifo`` (the same slices, one priority:
  FIFO in the order sent), ``whole_fifo`` (1M-element slices, FIFO) and, for the CNN, ``whole_prio``
  (1M slices with priorities: the wrapper without P3). The CNN's 4096x256 layer has exactly 1,048,576
  weights, so 1M slices send it as one 4.2 MB message.

Reported: mean and median step time (ms, after warm-up steps), the worker's CPU time per step, and the
effects as step-time savings: **priority** = 1 - p3 / slices_fifo (same slices, priority on vs off),
**slicing** = 1 - slices_fifo / whole_fifo (no priority, 50K vs 1M slices), and P3 as the wrapper's switch
changes it (1 - p3 / whole_prio). Never asserts. Medians are the robust figure on a busy machine.

Rows run one after the other, so load drifts between them; ``--repeats N`` runs the chosen rows N times,
interleaved (A B A B ...), and keeps each row's median over the runs' medians.

Usage::

    geomx bench --only frontend --quick
    section = run_frontend(quick=True, out_dir=Path("bench-results"))
    print("\\n".join(lines(section)))
    # python -m geomx.bench.frontend --rows cnn_p3 cnn_slices_fifo --repeats 3 --out bench-results
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..launch import launch
from .alone import run_alone
from .sections import BenchPlan, Interrupted
from .tables import say

WHOLE = 1 << 20  # the slice size without P3, set explicitly (whatever the topology default is)
P3_SLICE = 50_000


@dataclass(frozen=True)
class FrontendRow:
    """One job of the section."""

    loop: str  # sequential or wrapper
    model: str  # cnn (CommBoundCNN) or deep (DeepCNN)
    slice_elems: int
    priorities: bool
    bandwidth: str
    batch_size: int
    # where the wrapper's SGD runs: on the global server, as the kvstore loop's (translate), or on the workers
    server_optimizer: str = "translate"

    def topology(self) -> dict[str, Any]:
        p3 = self.slice_elems == P3_SLICE
        return {"parties": {"dc0": {"workers": 1}, "dc1": {"workers": 1}}, "central": "dc0",
                "slice_elems": WHOLE,
                "links": {"lan": {"bandwidth": "10Gbit", "latency": "0ms"},
                          "wan": {"bandwidth": self.bandwidth, "latency": "25ms"}},
                "training": {"p3": p3, "p3_slice_elems": P3_SLICE, "priorities": self.priorities,
                             "server_optimizer": self.server_optimizer}}


ROWS = {
    "sequential": FrontendRow("sequential", "cnn", WHOLE, True, "1Gbit", 64),
    "wrapper": FrontendRow("wrapper", "cnn", WHOLE, True, "1Gbit", 64),
    "wrapper_local": FrontendRow("wrapper", "cnn", WHOLE, True, "1Gbit", 64, server_optimizer="none"),
    **{f"{model}_{name}": FrontendRow("wrapper", model, slices, priorities, "100Mbit", 16)
       for model in ("cnn", "deep")
       for name, slices, priorities in (("p3", P3_SLICE, True), ("slices_fifo", P3_SLICE, False),
                                        ("whole_fifo", WHOLE, False), ("whole_prio", WHOLE, True))
       if not (model == "deep" and name == "whole_prio")},
}
P3_GOAL = 0.20


def _run(name: str, row: FrontendRow, steps: int, warmup: int, out_dir: Path) -> dict[str, Any]:
    run_dir = out_dir / "runs" / f"frontend_{name}"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    topology = out_dir / "topologies" / f"frontend_{name}.yaml"
    topology.parent.mkdir(parents=True, exist_ok=True)
    topology.write_text(yaml.safe_dump(row.topology(), sort_keys=False))
    command = [sys.executable, "-m", "geomx.bench.workers.frontend", "--loop", row.loop, "--model", row.model,
               "--steps", str(steps), "--warmup", str(warmup), "--batch-size", str(row.batch_size)]
    log = io.StringIO()
    result = launch(topology, command, run_dir=run_dir, out=log)
    (out_dir / "logs").mkdir(parents=True, exist_ok=True)
    (out_dir / "logs" / f"frontend_{name}.log").write_text(log.getvalue())
    if result.exit_code != 0:
        raise RuntimeError(f"{name} failed ({result.failed}); see {out_dir / 'logs'}/frontend_{name}.log")
    workers = [json.loads(p.read_text()) for p in sorted((run_dir / "out").glob("frontend-*.json"))]
    if not workers:
        raise RuntimeError(f"{name} wrote no timings")
    mean = {key: sum(w[key] for w in workers) / len(workers) for key in workers[0] if key.endswith("_ms")}
    return {**mean, "wan": row.bandwidth, "batch_size": row.batch_size, "model": row.model,
            "slice_elems": row.slice_elems, "priorities": row.priorities, "workers": workers,
            "wall_s": result.wall_s, "wan_bytes": result.summary.get("wan_bytes")}


def saving(rows: dict[str, dict[str, Any]], faster: str, slower: str, key: str = "step_median_ms") -> float | None:
    """1 - rows[faster] / rows[slower] on ``key`` (>0: ``faster`` is), None if either is missing.

    Usage: ``saving(rows, "cnn_p3", "cnn_slices_fifo")`` is what priority alone is worth.
    """
    if faster not in rows or slower not in rows:
        return None
    return 1 - rows[faster][key] / rows[slower][key]


EFFECTS = {"priority": ("p3", "slices_fifo"), "slicing": ("slices_fifo", "whole_fifo"),
           "p3_switch": ("p3", "whole_prio"), "p3_vs_fifo": ("p3", "whole_fifo")}


def _merge(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One row from its repeated runs: the median of each ``*_ms`` figure, the runs kept under ``runs``."""
    if len(runs) == 1:
        return runs[0]
    merged = {key: statistics.median(r[key] for r in runs) for key in runs[0] if key.endswith("_ms")}
    return {**runs[0], **merged, "runs": runs}


def run_frontend(quick: bool, out_dir: Path, names: list[str] | None = None, repeats: int = 1) -> dict[str, Any]:
    """Run the jobs (``names``, default all; ``repeats`` times, interleaved); returns the section's figures
    (with ``errors`` for runs that failed)."""
    steps, warmup = (10, 3) if quick else (30, 5)
    chosen = names or list(ROWS)
    unknown = sorted(set(chosen) - set(ROWS))
    if unknown:
        raise ValueError(f"unknown frontend rows {unknown}; valid: {list(ROWS)}")
    section: dict[str, Any] = {"setup": {"steps": steps, "warmup": warmup, "parties": "2 x 1 worker",
                                         "repeats": repeats,
                                         "models": {"cnn": "CommBoundCNN 1.1M params",
                                                    "deep": "DeepCNN 6 convs (47k) + dense 1.3M"}},
                               "rows": {}, "errors": []}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in chosen}
    try:
        for repeat in range(repeats):
            for name in chosen:
                say(f"[frontend] {name} ({repeat + 1}/{repeats}) ...")
                try:
                    runs[name].append(_run(name, ROWS[name], steps, warmup, out_dir))
                except RuntimeError as exc:
                    section["errors"].append(str(exc))
    except KeyboardInterrupt:  # SIGINT/SIGTERM (the job in flight has stopped): the runs so far, marked interrupted
        section["interrupted"] = True
        raise Interrupted(_figures(section, runs)) from None
    return _figures(section, runs)


def _figures(section: dict[str, Any], runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The section with its rows (each row's runs merged) and the effects measured between rows."""
    section["rows"] = {name: _merge(done) for name, done in runs.items() if done}
    rows = section["rows"]
    if "sequential" in rows and "wrapper" in rows:
        section["wrapper_over_sequential"] = rows["wrapper"]["step_ms"] / rows["sequential"]["step_ms"]
    section["effects"] = {
        model: {effect: {"median": saving(rows, f"{model}_{a}", f"{model}_{b}"),
                         "mean": saving(rows, f"{model}_{a}", f"{model}_{b}", "step_ms")}
                for effect, (a, b) in EFFECTS.items()}
        for model in ("cnn", "deep")}
    return section


def run(plan: BenchPlan, out_dir: Path) -> dict[str, Any]:
    """The section's entry point: every row once (``run_frontend`` repeats and picks rows)."""
    return run_frontend(plan.quick, out_dir)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:+.0f}%"


def lines(section: dict[str, Any]) -> list[str]:
    """The section's table for ``geomx bench``'s report."""
    setup = section["setup"]
    out = [f"[frontend] {setup['parties']}, WAN latency 25 ms; {setup['steps']} steps after {setup['warmup']} "
           f"warm-up; models: {', '.join(f'{k} = {v}' for k, v in setup['models'].items())}"]
    for name, row in section["rows"].items():
        extra = ""
        if "comm_ms" in row:
            extra = (f"  (forward {row['forward_ms']:.0f} + backward {row['backward_ms']:.0f} + "
                     f"communication {row['comm_ms']:.0f} ms, one after the other)")
        elif "backward_ms" in row:
            extra = (f"  (forward incl. waits for updates {row['forward_ms']:.0f} + backward incl. pushes "
                     f"{row['backward_ms']:.0f} ms)")
        slices = "50K" if row.get("slice_elems") == P3_SLICE else "1M"
        order = "priority" if row.get("priorities", True) else "FIFO"
        out.append(f"  {name:<16} WAN {row['wan']:>7} batch {row['batch_size']:>3} {slices:>3} slices {order:<8} "
                   f"step mean {row['step_ms']:7.1f} median {row.get('step_median_ms', float('nan')):7.1f} ms  "
                   f"CPU {row.get('cpu_ms', float('nan')):6.1f} ms{extra}")
    if "wrapper_over_sequential" in section:
        out.append(f"  wrapper / sequential: {section['wrapper_over_sequential']:.2f}x (goal < 1: backward and "
                   "communication overlap)")
    for model, effects in section.get("effects", {}).items():
        shown = {k: v for k, v in effects.items() if v["median"] is not None}
        if not shown:
            continue
        parts = {"priority": "priority (p3 vs slices_fifo)", "slicing": "slicing (slices_fifo vs whole_fifo)",
                 "p3_switch": "p3 switch (p3 vs whole_prio)", "p3_vs_fifo": "P3 vs neither (p3 vs whole_fifo)"}
        out.append(f"  {model} step-time saving, median (mean): " + "; ".join(
          f"{parts[k]} {_pct(v['median'])} ({_pct(v['mean'])})" for k, v in shown.items()))
    out.append(f"  (goal for P3 as a whole: >= {100 * P3_GOAL:.0f}% shorter steps)")
    out += [f"  error: {error}" for error in section.get("errors", [])]
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m geomx.bench.frontend``: chosen rows, repeated and interleaved; prints the table, writes JSON
    (a stop: ``geomx bench``'s, ``geomx.bench.alone``)."""
    parser = argparse.ArgumentParser(prog="python -m geomx.bench.frontend",
                                     description="the frontend bench rows, repeated and interleaved")
    parser.add_argument("--rows", nargs="+", choices=list(ROWS), default=None)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    out_dir = args.out.resolve()
    return run_alone("frontend", lambda: run_frontend(args.quick, out_dir, args.rows, args.repeats), out_dir, lines)


if __name__ == "__main__":
    sys.exit(main())
