"""``geomx bench --only quality``: what each synchronization algorithm and WAN codec costs in validation loss.

The zoo's character transformer (``geomx.zoo.charlm``) on the standard library's text, every row trained on the
same global batches in the same order (``geomx.bench.workers.quality``) for the same token budget, and evaluated on
the same validation windows. Rows:

* ``single``: one process, AdamW on the global batch of all ranks (the reference);
* ``ddp``: torch DDP over gloo, 4 ranks (``torch.distributed.run``);
* every other row: ``geomx.launch`` of 2 parties x 2 ranks with ``lan: collective`` (each party one gloo group, as
  torchrun starts it; no local server): ``fsa``, ``fsa_int8``, ``fsa_bsc``, ``fsa_bsc_frozen``, ``mixed``,
  ``mixed_dcasgd``, ``mixed_dcadam``, ``ssp``, and HFA with DiLoCo's outer Nesterov (``diloco``, ``streaming``,
  ``diloco_int8``, ``diloco_bsc``, ``diloco_sparse2bit``).

Each record: ``val_loss`` (the last evaluation), its ratio to ``ddp``'s, ``bytes_per_param`` (WAN bytes the
non-central party sent to the global servers, from the run's stats files, per outer step, over the parameter count:
per step for the FSA-like rows), ``wan_mb`` (the job's WAN bytes, both ways) and ``wall_s``; plots of validation
loss against tokens and against WAN bytes (``OUT/quality_tokens.png``, ``OUT/quality_wan.png``; the curves also in
``OUT/quality.csv``).
``--quick`` runs the rows the goals name (``GOAL_ROWS``) at the same budget.

Usage::

    geomx bench --only quality --quick
    python -m geomx.bench.quality fsa streaming ssp    # chosen rows: bench-results/quality.json and the table
    section = measure_rows(("single", "fsa"), replace(BUDGET, steps=4, eval_every=2), Path("out"))
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..runs.runlog import read_stats
from ..runs.summary import traffic
from .alone import add_out, chosen, run_alone
from .jobs import load_avg, run_job, write_topology
from .quality_rows import BUDGET, ROWS, Budget, QualityRow
from .sections import BenchPlan, Interrupted
from .tables import fmt, say, table

WORKER = Path(__file__).parent / "workers" / "quality.py"
CENTRAL = "dc0"


ROW_NAMES = tuple(row.name for row in ROWS)
GOAL_ROWS = ("single", "ddp", "fsa", "diloco", "diloco_int8", "diloco_sparse2bit")
# ring all-reduce: each rank sends 2 (N-1) / N of the gradient's 4 bytes per parameter; of a ring 0-1-2-3 of two
# data centers, one link each way crosses the WAN: a party sends that much per step
DDP_RING_BYTES_PER_PARAM = 2 * (BUDGET.world - 1) / BUDGET.world * 4


def topology(row: QualityRow, budget: Budget) -> dict[str, Any]:
    """2 parties x 2 ranks, ``lan: collective``, no emulated links (the section measures loss and bytes, not time);
    every tensor may be compressed (``size_lower_bound: 0``: the tiny model's tensors are all below GeoMX's 200K)."""
    raw: dict[str, Any] = {
        "parties": {"dc0": {"workers": 2, "lan": "collective"}, "dc1": {"workers": 2, "lan": "collective"}},
        "central": CENTRAL, "global_servers": 1, "size_lower_bound": 0, "status": False,
        "timeouts": {"register": "120s", "request": "300s", "round": "300s", "shutdown": "60s"},
    }
    if row.training:
        raw["training"] = dict(row.training)
    if row.hfa:
        raw["hfa"] = {"k1": budget.hfa[0], "k2": budget.hfa[1]}
    return raw


def worker_args(row: QualityRow, budget: Budget, curve: Path) -> list[str]:
    mode = {"single": "single", "ddp": "ddp"}.get(row.kind, "geomx")
    return ["--mode", mode, "--out", str(curve), "--preset", budget.preset, "--steps", str(budget.steps),
            "--batch-size", str(budget.batch_size), "--world", str(budget.world), "--optimizer", row.optimizer,
            "--lr", str(row.lr or budget.lr), "--schedule", row.schedule, "--eval-every", str(budget.eval_every),
            "--eval-windows", str(budget.eval_windows), "--seed", str(budget.seed), "--timeout-s",
            str(budget.timeout_s), "--max-chars", str(budget.max_chars)] + (
            ["--freeze-after", str(row.freeze_after)] if row.freeze_after is not None else [])


def parameters(preset: str) -> int:
    from ..zoo.charlm import build  # torch: only when the section runs

    return sum(p.numel() for p in build(preset).parameters())


def outer_steps(row: QualityRow, budget: Budget) -> int:
    """The WAN rounds a party makes: one per step (FSA-like rows), one per K1 x K2 steps under HFA (streaming: a
    cycle of every fragment)."""
    return max(1, budget.steps // budget.outer_every) if row.hfa else budget.steps


def sent_to_global_servers(stats: list[dict[str, Any]]) -> dict[str, int]:
    """Bytes each party's processes sent to the global servers over the WAN (the stats files' per-peer counters):
    the model's data, without the scheduler's registration, barriers and heartbeats (at 1 s a heartbeat, those
    would weigh on a small model's figure in proportion to the job's wall time, not to what the codec sends)."""
    sent: dict[str, int] = {}
    for entry in stats:
        party = str(entry.get("party", "?"))
        to_servers = sum(int(peer.get("sent", 0)) for name, peer in entry.get("peers", {}).items()
                         if "global_server" in name and peer.get("class") == "wan")
        sent[party] = sent.get(party, 0) + to_servers
    return sent


def bytes_per_param(sent_by_party: dict[str, int], central: str, rounds: int, params: int) -> float | None:
    """WAN bytes one way per party per outer step over the parameter count: the mean of what each non-central
    party sent (the central party's count also holds the global servers' answers to everyone), divided by
    ``rounds`` and ``params``. None where no such party sent anything."""
    far = [sent for party, sent in sent_by_party.items() if party != central]
    if not far or not any(far) or rounds < 1 or params < 1:
        return None
    return sum(far) / len(far) / rounds / params


def ratio_to(value: float | None, base: float | None) -> float | None:
    """``value / base``, None when either is missing or the base is 0."""
    return value / base if value is not None and base else None


def read_curve(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise RuntimeError(f"the row left no evaluations at {path}")
    points = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not points:
        raise RuntimeError(f"the row left no evaluations at {path}")
    return points


def with_wan(points: list[dict[str, Any]], wan_bytes: float, steps: int) -> list[dict[str, Any]]:
    """Each point with ``wan_mb``: the job's WAN bytes pro rata by steps (every outer step sends alike)."""
    return [{**p, "wan_mb": wan_bytes * p["step"] / max(steps, 1) / 1e6} for p in points]


Command = Callable[[Path, list[str]], list[str]]


def python_command(script: Path, args: list[str]) -> list[str]:
    return [sys.executable, str(script), *args]


def run_local(command: list[str], log: Path, timeout_s: float) -> tuple[int, float]:
    """Run a command that is not a geomx job (single, ddp) with its output in ``log``: (exit code, wall s)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with open(log, "w") as out:
        try:
            done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s, check=False)
            code = done.returncode
        except subprocess.TimeoutExpired:
            code = 124
    return code, time.monotonic() - started


def measure_row(row: QualityRow, budget: Budget, out_dir: Path, params: int, command: Command) -> dict[str, Any]:
    """Run one row and return its record; RuntimeError says why it could not be measured."""
    name = f"quality-{row.name}"
    curve_path = out_dir / "curves" / f"{name}.jsonl"
    curve_path.unlink(missing_ok=True)
    args = worker_args(row, budget, curve_path)
    log = out_dir / "logs" / f"{name}.log"
    rounds = outer_steps(row, budget)
    if row.kind == "geomx":
        path = write_topology(out_dir / "topologies" / f"{name}.yaml", topology(row, budget))
        result, _ = run_job(name, path, command(WORKER, args), out_dir)
        if result.exit_code != 0:
            raise RuntimeError(f"{name} failed ({result.failed}); see {log}")
        stats = read_stats(out_dir / "runs" / name)
        wan = float(traffic(stats)["wan_bytes"] or 0)
        per_param = bytes_per_param(sent_to_global_servers(stats), CENTRAL, rounds, params)
        wall, estimated = result.wall_s, False
    else:
        if row.kind == "single":
            cmd = command(WORKER, args)
        else:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                   str(budget.world), str(WORKER), *args]
        code, wall = run_local(cmd, log, budget.timeout_s)
        if code != 0:
            raise RuntimeError(f"{name} exited {code}; see {log}")
        per_param = DDP_RING_BYTES_PER_PARAM if row.kind == "ddp" else 0.0
        wan, estimated = per_param * params * rounds * 2, row.kind == "ddp"  # both parties' sends
    points = with_wan(read_curve(curve_path), wan, budget.steps)
    return {"row": row.name, "val_loss": points[-1]["val_loss"], "accuracy": points[-1]["accuracy"],
            "bytes_per_param": per_param, "bytes_estimated": estimated, "wan_mb": wan / 1e6, "wall_s": wall,
            "outer_steps": rounds, "tokens": points[-1]["tokens"], "curve": points, "load_avg_after": load_avg()}


def add_ratios(records: dict[str, dict[str, Any]]) -> None:
    """Every record's ``val_loss_vs_ddp``: its loss over ddp's (None without a ddp row)."""
    base = records.get("ddp", {}).get("val_loss")
    for record in records.values():
        record["val_loss_vs_ddp"] = ratio_to(record["val_loss"], base)


def quality_goals(records: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The issue's goals, measured (reported, never asserted): each with the two losses' ratio and whether met."""
    goals: dict[str, Any] = {}
    for name, row, base, limit in (("fsa_vs_single", "fsa", "single", 1.005), ("diloco_vs_ddp", "diloco", "ddp", 1.03),
                                   ("int8_vs_diloco", "diloco_int8", "diloco", 1.005),
                                   ("sparse2bit_vs_diloco", "diloco_sparse2bit", "diloco", 1.01)):
        if row in records and base in records:
            value = ratio_to(records[row]["val_loss"], records[base]["val_loss"])
            goals[name] = {"ratio": value, "limit": limit, "met": value is not None and value <= limit}
    if "diloco_sparse2bit" in records:
        per_param = records["diloco_sparse2bit"]["bytes_per_param"]
        goals["sparse2bit_bytes"] = {"bytes_per_param": per_param, "limit": 0.05,
                                     "met": per_param is not None and per_param <= 0.05}
    return goals


def plot(records: dict[str, dict[str, Any]], out_dir: Path) -> list[str]:
    """The curves as CSV, and as two PNGs where matplotlib imports: loss against tokens, and against WAN MB."""
    lines = ["row,step,tokens,wan_mb,val_loss"]
    lines += [f"{r['row']},{p['step']},{p['tokens']},{p['wan_mb']:.6f},{p['val_loss']:.6f}"
              for r in records.values() for p in r["curve"]]
    (out_dir / "quality.csv").write_text("\n".join(lines) + "\n")
    written = [str(out_dir / "quality.csv")]
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return written
    for axis, label, log_x in (("tokens", "training tokens", False), ("wan_mb", "WAN MB (both ways)", True)):
        figure, ax = plt.subplots(figsize=(8, 5))
        for record in records.values():
            points = [p for p in record["curve"] if not log_x or p[axis] > 0]
            if points:
                ax.plot([p[axis] for p in points], [p["val_loss"] for p in points], marker=".", label=record["row"])
        ax.set_xlabel(label)
        ax.set_ylabel("validation loss (nats / character)")
        if log_x:
            ax.set_xscale("log")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        path = out_dir / f"quality_{'tokens' if axis == 'tokens' else 'wan'}.png"
        figure.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(figure)
        written.append(str(path))
    return written


def measure_rows(names: tuple[str, ...], budget: Budget, out_dir: Path,
                 command: Command = python_command) -> dict[str, Any]:
    """Run the named rows in ``ROWS`` order at ``budget``; the section's dict (``run``'s).

    ``command(script, args)``: how the single row and a geomx row's workers start the worker script (a test forks
    them warm); ddp's ranks start under ``torch.distributed.run``."""
    unknown = sorted(set(names) - set(ROW_NAMES))
    if unknown:
        raise ValueError(f"unknown quality rows {unknown}; valid: {', '.join(ROW_NAMES)}")
    out_dir.mkdir(parents=True, exist_ok=True)
    params = parameters(budget.preset)
    section: dict[str, Any] = {"budget": asdict(budget), "parameters": params, "rows": {}, "errors": [],
                               "load_avg_start": load_avg(), "lan": "collective", "parties": 2, "ranks_per_party": 2}
    try:
        for row in (r for r in ROWS if r.name in names):
            say(f"[quality] {row.name}: {budget.steps} steps of {budget.preset} ...")
            try:
                record = measure_row(row, budget, out_dir, params, command)
            except RuntimeError as exc:
                section["errors"].append(f"{row.name}: {exc}")
                say(f"[quality] {row.name} FAILED: {exc}")
                continue
            section["rows"][row.name] = record
            say(f"[quality] {row.name}: val loss {record['val_loss']:.4f}, "
                f"{fmt(record['bytes_per_param'], '.4f')} B/param, wall {record['wall_s']:.1f} s")
    except KeyboardInterrupt:
        section["interrupted"] = True
        add_ratios(section["rows"])
        raise Interrupted(section) from None
    add_ratios(section["rows"])
    section["goals"] = quality_goals(section["rows"])
    section["plots"] = plot(section["rows"], out_dir) if section["rows"] else []
    section["load_avg_end"] = load_avg()
    return section


def run(plan: BenchPlan, out_dir: Path) -> dict[str, Any]:
    """The section's entry point: the goals' rows with ``--quick``, every row otherwise, at ``BUDGET``."""
    return measure_rows(GOAL_ROWS if plan.quick else ROW_NAMES, BUDGET, out_dir)


def lines(section: dict[str, Any]) -> list[str]:
    """The section's table and goals for ``geomx bench``'s report."""
    b = section["budget"]
    tokens = b["steps"] * b["batch_size"] * b["world"] * 64
    out = [f"[quality] charlm {b['preset']} ({section['parameters']} parameters), {b['steps']} steps x "
           f"{b['batch_size'] * b['world']} windows ({tokens / 1e6:.2f}M tokens) for every row; 2 parties x 2 ranks "
           f"(lan: collective), H = {b['hfa'][0] * b['hfa'][1]}; load avg {section.get('load_avg_start')} -> "
           f"{section.get('load_avg_end')}"]
    cells = [[r["row"], fmt(r["val_loss"], ".4f"), fmt(r.get("val_loss_vs_ddp"), ".4f"),
              ("~" if r["bytes_estimated"] else "") + fmt(r["bytes_per_param"], ".4f"), fmt(r["wan_mb"], ".2f"),
              fmt(r["wall_s"], ".1f")] for r in section["rows"].values()]
    out += table(["row", "val_loss", "vs ddp", "bytes/param", "WAN MB", "wall s"], cells)
    out.append("note: bytes/param = WAN bytes dc1 sent to the global servers / outer steps (FSA-like rows: steps) / "
               "parameters; ~: DDP's ring all-reduce, computed (2 (N-1)/N x 4),")
    out.append("      not measured; WAN MB: the job's, both ways, control traffic included; vs ddp: val_loss / ddp's.")
    for name, goal in section.get("goals", {}).items():
        shown = fmt(goal.get("ratio", goal.get("bytes_per_param")), ".4f")
        out.append(f"goal {name}: {shown} (limit {goal['limit']}): {'met' if goal['met'] else 'not met'}")
    out += [f"error: {e}" for e in section.get("errors", [])]
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m geomx.bench.quality [ROW ...] [--out OUT]``: the chosen rows (default: the goals') at BUDGET;
    OUT/quality.json, the table, the plots. Flags are parsed before anything starts; a stop is ``geomx bench``'s."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m geomx.bench.quality",
                                     description="rows of the quality section at its token budget")
    parser.add_argument("rows", nargs="*", metavar="ROW",
                        help=f"default: {' '.join(GOAL_ROWS)} (the goals'); valid: {', '.join(ROW_NAMES)}")
    add_out(parser, "quality")
    args = parser.parse_args(argv)
    rows = chosen(parser, args.rows, ROW_NAMES, "row", GOAL_ROWS)
    out_dir = Path(args.out)
    return run_alone("quality", lambda: measure_rows(rows, BUDGET, out_dir), out_dir, lines)


if __name__ == "__main__":
    sys.exit(main())
