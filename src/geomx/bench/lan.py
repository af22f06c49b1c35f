"""``geomx bench --only lan``: one party's training step under each LAN tier, side by side on loopback.

The same model, batch and SGD step on N ranks of one party (no WAN: the party's global server is on the same host):
``ddp`` is torch DDP over gloo (started by ``python -m torch.distributed.run``), ``collective`` is geomx's wrapper
in a ``lan: collective`` party (reduce-scatter, each rank's slices through the global server, all-gather),
``server`` the wrapper in a ``lan: server`` party (every gradient through the local server process). FSA with the
optimizer on every rank: all three do DDP's arithmetic. The party is alone in its job, so the global server answers
its pushes without a tensor (``geomx.core.early``): the tiers' pushes cross, the answers' bytes do not. ``--tiers``
adds ``collective_ddp`` (the script wraps its model in DDP itself, which geomx's FSA path replaces) and HFA's
(``collective_hfa``, ``server_hfa``, and ``collective_hfa_ddp``, where the script's own DDP makes the inner steps).
What changes between rows is only the LAN tier. ``plain`` (``--tiers``) runs the same ranks side by side with no
sync at all: the compute every tier adds to, so plain / tier is the share of the step the device computes.

With ``--device cuda`` the models and batches live on the GPU, DDP and the collective tier run over NCCL, and ranks
that outnumber the GPUs share them (``geomx.bench.workers.lan_step``).

Reported: the median step time (ms) of rank 0 after warm-up steps (the MLP runs 10x the steps), the CPU its process
used per step, and the ratios collective / ddp and server / collective. ``--repeats N`` runs the tiers in turns
(ddp, collective, server, ddp, ...) and takes each ratio as the median of the turns' own: on a shared 2-core VM a
step's time drifts by 10-30% over minutes, which back-to-back rows would read as a difference of tiers. Never
asserts.

Usage::

    geomx bench --only lan --quick
    python -m geomx.bench.lan --models mlp transformer --ranks 2 4 --repeats 2 --out bench-results
    python -m geomx.bench.lan --device cuda --models gpt57m --optimizer adamw --tiers plain ddp collective server
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from ..launch import launch
from .alone import run_alone
from .sections import BenchPlan
from .tables import fmt, say, table
from .workers.lan_step import MODELS

TIERS = ("ddp", "collective", "server")
# DiLoCo's shape inside the party (HFA, H = K1 * K2 = 10 steps per global round, outer Nesterov on the global
# server): collective all-reduces every step (DDP inside the party); server averages through the local server every
# K1 steps (local SGD inside the party). Their figure is the mean step, global rounds included.
HFA_TIERS = ("collective_hfa", "server_hfa", "collective_hfa_ddp")  # _ddp: the script's own DDP makes the inner step
ALL_TIERS = ("plain", *TIERS, "collective_ddp", *HFA_TIERS)  # collective_ddp: FSA, the script's DDP silenced
HFA = {"k1": 5, "k2": 2}
WARMUP = 5
# models whose step takes milliseconds run this many times the steps and warm-up steps: 25 steps of a few ms are
# over before a shared machine's drift averages out (the MLP's DDP step read 4.7 ms in one turn, 8.0 in the next)
STEP_FACTOR = {"mlp": 10}


def _topology(path: Path, ranks: int, tier: str) -> Path:
    lan, _, sync = tier.partition("_")
    raw: dict[str, Any] = {"parties": {"dc0": {"workers": ranks, "lan": lan}}, "central": "dc0",
                           "timeouts": {"register": "120s", "request": "300s", "round": "300s", "shutdown": "60s"}}
    if sync.startswith("hfa"):
        raw.update(hfa=HFA, training={"server_optimizer": "outer_nesterov"})
    path.write_text(yaml.safe_dump(raw))
    return path


def _worker_args(model: str, steps: int, out: Path, tier: str, device: str, optimizer: str) -> list[str]:
    return ["-m", "geomx.bench.workers.lan_step", "--tier", "geomx" if tier not in ("ddp", "plain") else tier,
            "--model", model, "--steps", str(steps), "--out", str(out), "--device", device, "--optimizer", optimizer,
            *(["--ddp"] if tier.endswith("_ddp") else [])]


def measure(model: str, ranks: int, tier: str, steps: int, work: Path, device: str = "cpu",
            optimizer: str = "sgd") -> dict[str, Any]:
    """One row: rank 0's step times under ``tier``; ``error`` says why there are none."""
    work.mkdir(parents=True, exist_ok=True)
    factor = STEP_FACTOR.get(model, 1)
    steps, warmup = steps * factor, WARMUP * factor
    out = work / f"{model}-{ranks}-{tier}.json"
    out.unlink(missing_ok=True)
    if tier in ("ddp", "plain"):
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                               f"--nproc-per-node={ranks}",
                               *_worker_args(model, steps, out, tier, device, optimizer)],
                              capture_output=True, text=True, timeout=1800, env={**os.environ})
        ok, tail = proc.returncode == 0, (proc.stdout + proc.stderr)[-1500:]
    else:
        path = _topology(work / f"{model}-{ranks}-{tier}.yaml", ranks, tier)
        log = io.StringIO()
        result = launch(path, [sys.executable, *_worker_args(model, steps, out, tier, device, optimizer)],
                        run_dir=work / f"run-{model}-{ranks}-{tier}", out=log)
        ok, tail = result.exit_code == 0, log.getvalue()[-1500:]
    if not ok or not out.exists():
        return {"error": tail}
    data = json.loads(out.read_text())
    timed = data["step_s"][warmup:] or data["step_s"]
    cpu = data.get("cpu_s", [])[warmup:] or data.get("cpu_s", [])
    return {"median_ms": 1000 * statistics.median(timed), "mean_ms": 1000 * statistics.fmean(timed),
            "params": data["params"], "steps": len(timed), "device": data.get("device_name", "cpu"),
            **({"cpu_ms": 1000 * statistics.median(cpu)} if cpu else {})}


def run(plan: BenchPlan, out_dir: Path) -> dict[str, Any]:
    """The section's entry point: quick, the MLP on 2 ranks; else both models on 2 and 4 ranks, the tiers in two
    turns."""
    if plan.quick:
        return measure_rows(("mlp",), (2,), 15, out_dir)
    return measure_rows(("mlp", "transformer"), (2, 4), 30, out_dir, repeats=2)


def measure_rows(models: tuple[str, ...], ranks: tuple[int, ...], steps: int, out_dir: Path,
                 tiers: tuple[str, ...] = TIERS, device: str = "cpu", optimizer: str = "sgd",
                 repeats: int = 1) -> dict[str, Any]:
    """Every (model, ranks) under every tier; the figures for bench.json. ``repeats``: the tiers run in turn that
    many times (ddp, collective, server, ddp, ...), so a drift of the machine's speed (a shared host's neighbours
    move a 2-core VM's step by 10-30% over minutes) reaches every tier alike; each ratio is the median of the
    rounds' own ratios, each tier's figure the median of its rounds'."""
    name = "AdamW" if optimizer == "adamw" else "SGD"
    section: dict[str, Any] = {"setup": {"steps": steps, "warmup": WARMUP, "device": device, "repeats": repeats,
                                         "host": "loopback, one party, no WAN (FSA's answers to a party alone "
                                                 "carry no tensor: its pushes cross, the answers' bytes do not)",
                                         "optimizer": f"{name} on every rank (FSA, server_optimizer auto)"},
                               "rows": [], "errors": []}
    for model in models:
        for count in ranks:
            runs: dict[str, list[dict[str, Any]]] = {tier: [] for tier in tiers}
            for turn in range(repeats):
                for tier in tiers:
                    say(f"[lan] {model}, {count} ranks, {tier}" + (f" (turn {turn + 1})" if repeats > 1 else "") +
                        " ...")
                    measured = measure(model, count, tier, steps, out_dir / "lan", device, optimizer)
                    if "error" in measured:
                        section["errors"].append(f"{model} {count} {tier}: {measured['error']}")
                    runs[tier].append(measured)
            section["rows"].append(combine(model, count, runs))
    return section


def combine(model: str, count: int, runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """One row from each tier's turns: the tier's figures (medians over turns, ``turns_ms`` each turn's), and the
    ratios as the median of each turn's ratio (tiers measured in the same turn, minutes apart, not tens)."""
    row: dict[str, Any] = {"model": model, "ranks": count}
    for tier, measured in runs.items():
        good = [m for m in measured if "error" not in m]
        if not good:
            row[tier] = measured[-1] if measured else {}
            continue
        row[tier] = {**good[0], "turns_ms": [step_ms(m, tier) for m in good],
                     **{k: statistics.median(m[k] for m in good) for k in ("median_ms", "mean_ms", "cpu_ms")
                        if all(k in m for m in good)}}

    def ratio(top: str, bottom: str) -> tuple[float | None, list[float]]:
        # a tier the run did not measure has no turns: no pairs
        turns = zip(runs.get(top, []), runs.get(bottom, []), strict=False)
        pairs = [(step_ms(a, top), step_ms(b, bottom)) for a, b in turns]
        each = [a / b for a, b in pairs if a and b]
        return (statistics.median(each) if each else None), each

    for key, top, bottom in (("collective_over_ddp", "collective", "ddp"),
                             ("server_over_collective", "server", "collective")):
        value, each = ratio(top, bottom)
        if value is not None:
            row[key], row[f"{key}_turns"] = value, each
    ms = {tier: step_ms(row.get(tier, {}), tier) for tier in ALL_TIERS}
    if ms["plain"]:  # the share of each tier's step that the device computes
        row["compute_share"] = {t: ms["plain"] / ms[t] for t in ALL_TIERS[1:] if ms[t]}
    return row


def step_ms(measured: dict[str, Any], tier: str) -> float | None:
    """A tier's step: the median, or the mean where global rounds come only every H steps (HFA)."""
    return measured.get("mean_ms" if tier in HFA_TIERS else "median_ms")


def lines(section: dict[str, Any]) -> list[str]:
    """The section's table for ``geomx bench``'s report."""
    setup = section["setup"]
    turns = setup.get("repeats", 1)
    out = [f"[lan] {setup['host']}; median step of rank 0 over {setup['steps'] - setup['warmup']} steps after "
           f"{setup['warmup']} warm-up (" + ", ".join(f"{m}: {f}x" for m, f in STEP_FACTOR.items()) +
           f"); {setup['optimizer']}" +
           (f"; tiers in {turns} turns, each figure the median of its turns', each ratio of the turns' ratios"
            if turns > 1 else "")]
    shown = [t for t in ALL_TIERS if any(t in row for row in section.get("rows", []))]
    rows = []
    for row in section.get("rows", []):
        params = next((row[t]["params"] for t in ALL_TIERS if "params" in row.get(t, {})), None)
        share = row.get("compute_share", {})
        rows.append([row["model"], fmt(params / 1e6 if params else None, ".1f", "M"), str(row["ranks"]),
                     *(fmt(step_ms(row.get(t, {}), t), ".1f") for t in shown),
                     fmt(row.get("collective_over_ddp"), ".2f", "x"),
                     fmt(row.get("server_over_collective"), ".2f", "x"),
                     " / ".join(f"{share[t]:.0%}" for t in shown if t in share) or "-",
                     " / ".join(fmt(row.get(t, {}).get("cpu_ms"), ".0f") for t in shown)])
    out += table(["model", "params", "ranks", *(f"{t} ms" for t in shown), "collective/ddp", "server/collective",
                  "compute share " + " / ".join(t for t in shown if t != "plain"),
                  "rank 0 CPU ms " + " / ".join(shown)], rows)
    if any(t in shown for t in HFA_TIERS):
        out.append(f"[lan] *_hfa*: HFA with K1={HFA['k1']}, K2={HFA['k2']}, outer Nesterov; the mean step; _ddp: "
                   "the script's own DDP makes the inner steps")
    return out + goal_lines(section.get("rows", []))


def goal_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The issue's goals for one party's step, each with the ratio measured in this run (never asserted): a
    collective party's step at most 1.05x plain DDP's, and the server tier's at least 2x the collective's."""
    out = []
    for row in rows:
        where = f"{row['model']}, {row['ranks']} ranks"
        for key, text, ok in (("collective_over_ddp", "collective step <= 1.05x DDP's", lambda v: v <= 1.05),
                              ("server_over_collective", "server tier's step >= 2x the collective's",
                               lambda v: v >= 2.0)):
            if key in row:
                value = row[key]
                out.append(f"goal (lan, {where}): {text}: {value:.2f}x -> {'met' if ok(value) else 'NOT met'}")
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m geomx.bench.lan``: the chosen rows; flags parsed before anything starts, a stop is ``geomx
    bench``'s (``geomx.bench.alone``)."""
    parser = argparse.ArgumentParser(prog="python -m geomx.bench.lan", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=["mlp"])
    parser.add_argument("--ranks", nargs="+", type=int, default=[2])
    parser.add_argument("--tiers", nargs="+", choices=list(ALL_TIERS), default=list(TIERS))
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--optimizer", choices=["sgd", "adamw"], default="sgd")
    parser.add_argument("--steps", type=int, default=None, help="per run (default 30; --quick 15)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="run the tiers in turn this many times; ratios are the median of each turn's")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default="bench-results")
    args = parser.parse_args(argv)
    out_dir = Path(args.out)
    steps = args.steps or (15 if args.quick else 30)
    return run_alone("lan", lambda: measure_rows(tuple(args.models), tuple(args.ranks), steps, out_dir,
                                                 tuple(args.tiers), args.device, args.optimizer, max(1, args.repeats)),
                     out_dir, lines)


if __name__ == "__main__":
    sys.exit(main())
