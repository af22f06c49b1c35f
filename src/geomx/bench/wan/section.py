"""``geomx bench --only wan``: geomx against DDP, PyTorch's local SGD and torchft DiLoCo on a kernel-shaped link.

Two network namespaces (one per data center) joined by a veth pair with ``tbf`` on both ends
(``geomx.bench.wan.netns``), first at 100 Mbit/s, then at 20 Mbit/s (each rate checked with a TCP probe first). Every
system trains the same job (``geomx.bench.wan.job``; ranks 0-1 in A, 2-3 in B, same seeds, batch, optimizer) for the
same epochs; geomx runs as two per-party launches with its emulator off. Two jobs (``--job``):

* ``mlp``: the digits MLP 64-1024-1024-10 (4.5 MB of gradients, SGD + momentum) to DDP-on-loopback's final
  accuracy minus 0.01;
* ``lm``: ``examples/lm.py``'s character transformer (``geomx.bench.wan.lm``: 2 blocks of width 128, 1.2 MB of
  gradients, Adam) to DDP-on-loopback's final validation loss plus 0.05 nats.

DDP also runs on loopback, unshaped: the LAN reference whose final value, one margin worse, is the target.
The kernel here has no ``netem``: the link has bandwidth but no added delay.

Per job, system and rate: time to the target (the job's model: DDP's, the averaged model after an averaging
round, geomx's global model after a global round; evaluation time excluded), final value, MB per direction from
the qdisc counters, compute utilization (steps x the calibrated compute of one step, over the training time)
and the ratios to DDP on the same link and to DDP on loopback. A run longer than the cap is cut: its figures
are those recorded until then (``cut``). Nothing is asserted.

Usage::

    geomx bench --only wan --quick       # MLP only, 100 Mbit/s only, 7 epochs, runs cut after 60 s of training
    geomx bench --only wan               # both jobs, both rates, MLP 10 epochs (cut after 240 s), lm 2 epochs
    geomx bench --only wan --job lm      # the lm job only (11 runs at 100 Mbit/s + 20 Mbit/s)
    python -m geomx.bench.wan --job lm --rates 100   # the lm row set at 100 Mbit/s only: ~10 minutes

Each run also spends 30-60 s starting (4-10 processes importing torch at once on 2 loaded cores); that time
is in no figure, but it is most of ``--quick``'s wall time (4 epochs took 7.6 minutes under load 12).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, replace
from importlib import metadata
from pathlib import Path
from typing import Any

from ..alone import run_alone
from ..sections import BenchPlan
from .goals import fmt as _fmt
from .goals import goal_lines
from .goals import ratio as _ratio
from .job import MLP, Job
from .jobs import JOBS, job
from .netns import NetnsError, unavailable_reason, wan_link
from .runs import System, run_system
from .systems import DDP, EXTRA_SYSTEMS, SYSTEMS, H, systems_for


@dataclass(frozen=True)
class WanPlan:
    rates_mbit: tuple[float, ...]
    epochs: int  # of the MLP job (the lm job runs its own ``Job.epochs``)
    cap_s: float  # a run is cut after this long of training (startup not counted)
    jobs: tuple[str, ...] = ("mlp",)

    def epochs_of(self, spec: Job) -> int:
        return self.epochs if spec is MLP else spec.epochs


# quick: 7 epochs, so that the periodic systems' evaluation at step 70 can meet the target (at 4 epochs none did)
QUICK = WanPlan(rates_mbit=(100.0,), epochs=7, cap_s=60.0, jobs=("mlp",))
FULL = WanPlan(rates_mbit=(100.0, 20.0), epochs=10, cap_s=240.0, jobs=JOBS)


def found_peers() -> dict[str, str | None]:
    """Installed versions of the peers (None: missing; ``pip install 'geomx[peers]'`` brings torchft)."""
    found: dict[str, str | None] = {}
    for package in ("torch", "torchft"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = None
    return found


def time_to(records: list[dict[str, Any]], target: float, spec: Job = MLP) -> float | None:
    """Training seconds until the first evaluation that reaches ``target`` (None: never reached)."""
    for record in records:
        if record.get(spec.metric) is not None and spec.reached(record[spec.metric], target):
            return float(record["time"])
    return None


def summarize(raw: dict[str, Any], target: float | None, spec: Job = MLP) -> dict[str, Any]:
    """Figures of one run from its rank-0 records and the link's byte counters (``final_accuracy``: the last
    evaluation of the job's metric, whichever it is)."""
    records = [r for r in raw["records"] if r.get(spec.metric) is not None]
    figures: dict[str, Any] = {k: v for k, v in raw.items() if k != "records"}
    figures["evaluations"] = [(r["step"], round(r["time"], 3), round(r[spec.metric], 4)) for r in records]
    if not records:
        return figures
    last = records[-1]
    train_s, steps = float(last["time"]), int(last["step"])
    figures.update(steps=steps, train_s=train_s, step_s=train_s / steps, final_accuracy=float(last[spec.metric]),
                   compute_util=steps * float(last["calibrated_step_s"]) / train_s,
                   measured_phases_util=float(last["compute_s"]) / train_s)
    if target is not None:
        figures["time_to_target_s"] = time_to(records, target, spec)
    if "bytes" in raw:
        figures["mb_a_to_b"] = raw["bytes"]["a_to_b"] / 1e6
        figures["mb_b_to_a"] = raw["bytes"]["b_to_a"] / 1e6
    if "bytes_training" in raw:  # from the moment rank 0's clock started: set-up left out
        figures["mb_train_a_to_b"] = raw["bytes_training"]["a_to_b"] / 1e6
        figures["mb_train_b_to_a"] = raw["bytes_training"]["b_to_a"] / 1e6
    return figures


def add_ratios(rows: dict[str, dict[str, Any]], loopback: dict[str, Any]) -> None:
    """``vs_ddp_link``: DDP-on-this-link's time to target / this one's (x sooner); ``vs_loopback``: this one's
    time / DDP-on-loopback's (1.0 = LAN speed). A DDP run cut before the target gives a lower bound (>=)."""
    ddp = rows.get(DDP.name, {})
    ddp_time = ddp.get("time_to_target_s")
    ddp_bound = ddp_time is None and ddp.get("cut_at_cap")
    for figures in rows.values():
        mine = figures.get("time_to_target_s")
        figures["vs_ddp_link"] = _ratio(ddp_time if ddp_time else (ddp.get("train_s") if ddp_bound else None), mine)
        figures["vs_ddp_link_is_lower_bound"] = bool(ddp_bound)
        figures["vs_loopback"] = _ratio(mine, loopback.get("time_to_target_s"))
        figures["step_speedup_vs_ddp"] = _ratio(ddp.get("step_s"), figures.get("step_s"))


def _say(text: str) -> None:
    print(text, flush=True)


def _run(system: System, link: Any, out: Path, plan: WanPlan, target: float | None, spec: Job) -> dict[str, Any]:
    _say(f"[wan] {spec.name}: {system.label} ({'loopback' if link is None else f'{link.rate_mbit:g} Mbit/s'}) ...")
    figures = summarize(run_system(system, link, out, plan.epochs_of(spec), plan.cap_s, spec.name), target, spec)
    figures["load_avg_after"] = [round(x, 2) for x in os.getloadavg()]
    _say(f"[wan]   {_brief(figures, spec)}")
    return figures


def _brief(f: dict[str, Any], spec: Job) -> str:
    if f.get("failed") or "final_accuracy" not in f:
        return f"FAILED {f.get('failed')}; logs in {f.get('logs')}"
    return (f"{f['steps']} steps in {f['train_s']:.1f} s, final {spec.metric} {f['final_accuracy']:.3f}, "
            f"to target {_fmt(f.get('time_to_target_s'), '.1f', ' s')}{' (cut)' if f.get('cut_at_cap') else ''}")


def run_wan(quick: bool, out_dir: Path, only: list[str] | None = None,
            rates_mbit: tuple[float, ...] | None = None, jobs: tuple[str, ...] | None = None,
            congestion: str | None = None) -> dict[str, Any]:
    """The whole section; returns the JSON-able result (also written to OUT/wan.json) and prints the table.

    ``only``: run just these systems (by name; DDP on loopback always runs: it sets the target);
    ``rates_mbit``: instead of the plan's rates; ``jobs``: instead of the plan's (quick: mlp, full: mlp and lm);
    ``congestion``: the link's TCP congestion control for every system (default: the host's; the table says which).
    """
    reason = unavailable_reason()
    if reason:
        _say(f"[wan] skipped: {reason}")
        return {"skipped": reason}
    plan = QUICK if quick else FULL
    plan = replace(plan, rates_mbit=rates_mbit or plan.rates_mbit, jobs=jobs or plan.jobs)
    out_dir = Path(out_dir) / "wan"
    peers = found_peers()
    _say(f"[wan] peers found: torch {peers['torch']} (DDP, PostLocalSGD); torchft {peers['torchft'] or 'MISSING'}"
         + ("" if peers["torchft"] else " (DiLoCo row skipped: pip install 'geomx[peers]')"))
    result: dict[str, Any] = {"plan": asdict(plan), "peers": peers, "sync_period": H,
                              "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "jobs": {}, "errors": [],
                              "labels": {s.name: s.label for s in (*SYSTEMS, *EXTRA_SYSTEMS)},
                              "load_avg_start": [round(x, 2) for x in os.getloadavg()]}
    specs = {name: job(name) for name in plan.jobs}
    for name, spec in specs.items():  # each job's target, from DDP on loopback
        block = _job_block(spec, plan, out_dir / name)
        result["jobs"][name] = block
        if "target" not in block:
            result["errors"].append(f"{name}: DDP on loopback failed: no target")
    try:
        with wan_link(congestion=congestion) as link:
            result["tcp_congestion"] = {"name": link.congestion(), "set": congestion is not None}
            for rate in plan.rates_mbit:
                link = link.set_rate(rate)
                probe = {"a_to_b": link.probe_mbit(), "b_to_a": link.probe_mbit(reverse=True)}
                _say(f"[wan] {rate:g} Mbit/s tbf: TCP probe {probe['a_to_b']:.1f} Mbit/s A->B, "
                     f"{probe['b_to_a']:.1f} B->A")
                for name, block in result["jobs"].items():
                    if "target" in block:
                        rows = _rows(specs[name], link, out_dir / name, plan, block, only, peers, result["errors"])
                        block["rates"][f"{rate:g}"] = {"probe_mbit": probe, "rows": rows}
    except NetnsError as exc:
        result["errors"].append(f"link: {exc}")
    result["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "wan.json").write_text(json.dumps(result, indent=2, default=str))
    _say("\n".join(wan_lines(result)))
    return result


def _job_block(spec: Job, plan: WanPlan, out_dir: Path) -> dict[str, Any]:
    """DDP on loopback for ``spec``, and the target it sets (one margin worse than its final value)."""
    loopback = _run(DDP, None, out_dir / "ddp-loopback", plan, None, spec)
    block: dict[str, Any] = {"job": spec.name, "title": spec.title, "metric": spec.metric,
                             "higher_is_better": spec.higher_is_better, "margin": spec.margin,
                             "epochs": plan.epochs_of(spec), "ddp_loopback": loopback, "rates": {}}
    if "final_accuracy" not in loopback:
        return block
    target = spec.target(loopback["final_accuracy"])
    loopback["time_to_target_s"] = time_to(
        [{"time": t, spec.metric: v} for _, t, v in loopback["evaluations"]], target, spec)
    block["target"] = target
    _say(f"[wan] {spec.name}: target {spec.metric} {target:.4f} (DDP on loopback after {block['epochs']} epochs, "
         f"{spec.margin} {'lower' if spec.higher_is_better else 'higher'})")
    return block


def _rows(spec: Job, link: Any, out_dir: Path, plan: WanPlan, block: dict[str, Any], only: list[str] | None,
          peers: dict[str, str | None], errors: list[str]) -> dict[str, dict[str, Any]]:
    """Every chosen system on ``spec`` across ``link`` at its current rate, with the ratios."""
    rows: dict[str, dict[str, Any]] = {}
    for system in systems_for(spec, only):
        if system.kind == "diloco" and not peers["torchft"]:
            rows[system.name] = {"skipped": "torchft not installed (pip install 'geomx[peers]')"}
            continue
        rows[system.name] = _run(system, link, out_dir / f"{system.name}-{link.rate_mbit:g}", plan, block["target"],
                                 spec)
        if rows[system.name].get("failed"):
            errors.append(f"{spec.name}: {system.name} at {link.rate_mbit:g} Mbit/s failed: "
                          f"{rows[system.name]['failed']}")
    add_ratios(rows, block["ddp_loopback"])
    return rows


def wan_lines(result: dict[str, Any]) -> list[str]:
    """The section's table (per job, one block per rate), for the terminal and the README."""
    if "skipped" in result:
        return [f"[wan] skipped: {result['skipped']}"]
    lines = []
    for block in result.get("jobs", {}).values():
        lines += job_lines(block, result)
    lines.append("vs DDP link: DDP's time to target on the same link / this one's (x sooner); vs DDP loopback: "
                 "this one's time / DDP's on loopback (1.00x = LAN speed); compute util: steps x calibrated "
                 "forward+backward+optimizer step / training time")
    lines += [f"error: {e}" for e in result.get("errors", [])]
    return lines


def job_lines(block: dict[str, Any], result: dict[str, Any]) -> list[str]:
    """One job's table: its target, then one block of rows per rate, then the issue's goals for it."""
    plan, loop, metric = result["plan"], block.get("ddp_loopback", {}), block["metric"]
    worse = "-" if block["higher_is_better"] else "+"
    lines = [f"[wan] {block['title']}, 2 namespaces x 2 ranks, {block['epochs']} epochs, runs cut at "
             f"{plan['cap_s']:g} s; target {metric} {_fmt(block.get('target'), '.4f')} (DDP loopback final "
             f"{_fmt(loop.get('final_accuracy'), '.4f')} {worse} {block['margin']}); DDP loopback reaches it in "
             f"{_fmt(loop.get('time_to_target_s'), '.1f', ' s')} ({_fmt(loop.get('step_s'), '.3f')} s/step); "
             f"H = {result['sync_period']}; tbf has no delay (no netem in this kernel)" + _congestion(result)]
    header = ["system", "s to target", f"final {'acc' if metric == 'accuracy' else metric}", "MB A->B", "MB B->A",
              "s/step", "compute util", "vs DDP link", "vs DDP loopback"]
    for rate, rate_block in block.get("rates", {}).items():
        probe = rate_block["probe_mbit"]
        lines.append(f"-- {rate} Mbit/s (TCP probe {probe['a_to_b']:.1f} / {probe['b_to_a']:.1f} Mbit/s)")
        rows = []
        for name, f in rate_block["rows"].items():
            label = result.get("labels", {}).get(name, name)
            if "skipped" in f or "final_accuracy" not in f:
                rows.append([label, f.get("skipped") or f"FAILED {f.get('failed')}", *[""] * 7])
                continue
            bound = ">=" if f.get("vs_ddp_link_is_lower_bound") else ""
            ttt = _fmt(f.get("time_to_target_s"), ".1f") + (" (cut)" if f.get("cut_at_cap") else "")
            rows.append([label, ttt, f"{f['final_accuracy']:.3f}", _fmt(f.get("mb_a_to_b"), ".1f"),
                         _fmt(f.get("mb_b_to_a"), ".1f"), f"{f['step_s']:.3f}", f"{f['compute_util']:.0%}",
                         bound + _fmt(f.get("vs_ddp_link"), ".2f", "x"), _fmt(f.get("vs_loopback"), ".2f", "x")])
        widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=False)]
        lines += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=False)) for r in [header, *rows]]
        lines += [f"   {result.get('labels', {}).get(name, name)}: {stream_line(f['wan_streams'])}"
                  for name, f in rate_block["rows"].items()
                  if any(len(sent) > 1 for sent in f.get("wan_streams", {}).values())]  # collective parties
    lines += goal_lines(block)
    return lines


def _congestion(result: dict[str, Any]) -> str:
    """The header's words for the link's TCP congestion control (results of older trees do not record it)."""
    cc = result.get("tcp_congestion")
    return "" if not cc else f"; TCP congestion control {cc['name']} ({'set' if cc['set'] else 'the host default'})"


def stream_line(streams: dict[str, dict[str, int]]) -> str:
    """WAN streams per party with each one's MB, and their balance (the largest over the smallest)."""
    parts = []
    for party, sent in streams.items():
        each = ", ".join(f"{name} {value / 1e6:.1f} MB" for name, value in sent.items())
        balance = max(sent.values()) / max(1, min(sent.values()))
        parts.append(f"{party} {len(sent)} stream{'s' if len(sent) > 1 else ''} ({each}; largest / smallest "
                     f"{balance:.2f})")
    return "WAN streams: " + "; ".join(parts)


def jobs_from(choice: str | None) -> tuple[str, ...] | None:
    """``--job mlp|lm|all`` as the jobs to run (None: the plan's)."""
    return None if choice is None else JOBS if choice == "all" else (choice,)


def run(plan: BenchPlan, out_dir: Path) -> dict[str, Any]:
    """The section's entry point for ``geomx bench --only wan`` (see ``run_wan``)."""
    return run_wan(plan.quick, out_dir, jobs=jobs_from(plan.wan_job), congestion=plan.wan_congestion)


def lines(result: dict[str, Any]) -> list[str]:
    """The section's table for ``geomx bench``'s report (see ``wan_lines``)."""
    return wan_lines(result)


def main(argv: list[str] | None = None) -> int:
    """``python -m geomx.bench.wan --only ddp geomx_best --rates 100 --job lm``: some rows of the section."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m geomx.bench.wan")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default="bench-results")
    parser.add_argument("--only", nargs="+", choices=[s.name for s in (*SYSTEMS, *EXTRA_SYSTEMS)])
    parser.add_argument("--rates", nargs="+", type=float, help="Mbit/s (default: the plan's)")
    parser.add_argument("--job", choices=[*JOBS, "all"], help="default: mlp with --quick, all otherwise")
    parser.add_argument("--congestion", help="the link's TCP congestion control, e.g. cubic or bbr (default: the "
                                             "host's, as the kernel gives new namespaces)")
    args = parser.parse_args(argv)
    # run_wan writes OUT/wan/wan.json and prints its table itself; a stop (SIGINT, SIGTERM) is geomx bench's
    return run_alone("wan", lambda: run_wan(args.quick, Path(args.out), args.only,
                                            tuple(args.rates) if args.rates else None, jobs_from(args.job),
                                            args.congestion), None, wan_lines)


if __name__ == "__main__":
    raise SystemExit(main())
