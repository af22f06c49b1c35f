"""``geomx bench``'s front-end section: does the PyTorch wrapper overlap, and what does P3 add?

One communication-bound CNN (1.1M parameters, its 1M-element dense layer deepest), 2 parties x 1 worker,
synthetic inputs. Two pairs of jobs:

- overlap, on a 1 Gbit/s 25 ms WAN with batch 64 (backward and communication of similar length):
  ``sequential`` is the kvstore loop (backward, then push all, then pull all) and ``wrapper`` the same
  model and server optimizer through ``geomx.torch.DistributedOptimizer``;
- P3, on the training section's 100 Mbit/s 25 ms WAN with batch 16 (communication-bound): the wrapper
  without (``p3_off``) and with P3 (``p3_on``: 50K-element slices, shallow layers first).

Reported: mean step time of each (ms, after warm-up steps), the worker process's CPU time per step (equal
CPU with a shorter step means overlap, not extra work; on a busy machine wall times mostly measure the
wait for a core), the sequential loop's forward, backward and communication times, and two ratios with
their goals: wrapper / sequential (< 1: overlap pays) and the P3 speed-up (goal >= 20%). Never asserts.

Usage::

    section = run_frontend(quick=True, out_dir=Path("bench-results"))
    print("\\n".join(frontend_lines(section)))
"""

from __future__ import annotations

import io
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import yaml

from .launch import launch

# name: (loop, P3, WAN bandwidth, batch size)
ROWS = {"sequential": ("sequential", False, "1Gbit", 64), "wrapper": ("wrapper", False, "1Gbit", 64),
        "p3_off": ("wrapper", False, "100Mbit", 16), "p3_on": ("wrapper", True, "100Mbit", 16)}
P3_GOAL = 0.20


def _topology(path: Path, p3: bool, bandwidth: str) -> Path:
    raw = {"parties": {"dc0": {"workers": 1}, "dc1": {"workers": 1}}, "central": "dc0",
           "links": {"lan": {"bandwidth": "10Gbit", "latency": "0ms"},
                     "wan": {"bandwidth": bandwidth, "latency": "25ms"}},
           "training": {"p3": p3}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _run(name: str, row: tuple[str, bool, str, int], steps: int, warmup: int, out_dir: Path) -> dict[str, Any]:
    loop, p3, bandwidth, batch = row
    run_dir = out_dir / "runs" / f"frontend_{name}"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    topology = _topology(out_dir / "topologies" / f"frontend_{name}.yaml", p3, bandwidth)
    command = [sys.executable, "-m", "geomx.bench_workers.frontend", "--loop", loop, "--steps", str(steps),
               "--warmup", str(warmup), "--batch-size", str(batch)]
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
    return {**mean, "wan": bandwidth, "batch_size": batch, "workers": workers, "wall_s": result.wall_s,
            "wan_bytes": result.summary.get("wan_bytes")}


def run_frontend(quick: bool, out_dir: Path) -> dict[str, Any]:
    """Run the three jobs; returns the section's figures (with ``errors`` for runs that failed)."""
    steps, warmup = (10, 3) if quick else (30, 5)
    section: dict[str, Any] = {"setup": {"steps": steps, "warmup": warmup, "parties": "2 x 1 worker",
                                         "model": "CommBoundCNN 1.1M params"},
                               "rows": {}, "errors": []}
    for name, row in ROWS.items():
        print(f"[frontend] {name} ...", flush=True)
        try:
            section["rows"][name] = _run(name, row, steps, warmup, out_dir)
        except RuntimeError as exc:
            section["errors"].append(str(exc))
    rows = section["rows"]
    if "sequential" in rows and "wrapper" in rows:
        section["wrapper_over_sequential"] = rows["wrapper"]["step_ms"] / rows["sequential"]["step_ms"]
    if "p3_off" in rows and "p3_on" in rows:
        section["p3_speedup"] = 1 - rows["p3_on"]["step_ms"] / rows["p3_off"]["step_ms"]
    return section


def frontend_lines(section: dict[str, Any]) -> list[str]:
    """The section's table for ``geomx bench``'s report."""
    setup = section["setup"]
    lines = [f"[frontend] {setup['model']}, {setup['parties']}, WAN latency 25 ms; mean of {setup['steps']} "
             f"steps after {setup['warmup']} warm-up"]
    for name, row in section["rows"].items():
        extra = ""
        if "comm_ms" in row:
            extra = (f"  (forward {row['forward_ms']:.0f} + backward {row['backward_ms']:.0f} + "
                     f"communication {row['comm_ms']:.0f} ms, one after the other)")
        elif "backward_ms" in row:
            extra = (f"  (forward incl. waits for updates {row['forward_ms']:.0f} + backward incl. pushes "
                     f"{row['backward_ms']:.0f} ms)")
        lines.append(f"  {name:<10} WAN {row['wan']:>7} batch {row['batch_size']:>3}  step {row['step_ms']:7.1f} ms"
                     f"  CPU {row.get('cpu_ms', float('nan')):6.1f} ms{extra}")
    if "wrapper_over_sequential" in section:
        lines.append(f"  wrapper / sequential: {section['wrapper_over_sequential']:.2f}x (goal < 1: backward and "
                     "communication overlap)")
    if "p3_speedup" in section:
        verdict = "met" if section["p3_speedup"] >= P3_GOAL else "NOT met"
        lines.append(f"  P3 speed-up (p3_on over p3_off): {100 * section['p3_speedup']:.0f}% "
                     f"(goal >= {100 * P3_GOAL:.0f}%: {verdict})")
    lines += [f"  error: {error}" for error in section.get("errors", [])]
    return lines
