"""``geomx bench --only scale``: the 85M-parameter job across two data centers, its accelerators' utilization
against the WAN's bandwidth, with the accelerator stand-in (``geomx.bench.standin``) on machines without a GPU.

2 parties x 2 ranks, ``lan: collective`` (each party's ranks one gloo group, each rank syncing the slices it owns
over its own connection), the emulated WAN at 100 Mbit/s, 1 Gbit/s and 10 Gbit/s with 25 ms one way, H = 100 and
500 inner steps per outer round. Configurations (``CONFIGS``), all DiLoCo-shaped (outer Nesterov on the global
server): ``blocking`` (every outer round waits for the whole model's round trip), ``streaming`` (4 fragments, each
global once every H steps, one every H/4, its round overlapping the next H/4 steps; the new global model mixed
half and half), ``streaming_int8`` and ``streaming_fp16`` (the same with that WAN codec both ways),
``streaming_sparse2bit`` (the same with sparse2bit, the outer step averaging, as the quality section's row).
``plain`` runs the same ranks with no sync at all: the control (utilization 1 by construction) and plain
PyTorch's memory.

Per run: utilization (the stand-in's steps x step time / the loop's wall time, the mean over ranks), seconds
blocked per outer round, the far party's WAN MB each way (dc0 holds the global tier), each process's peak
resident memory over the model's fp32 bytes, and CPU seconds (user + sys: a rank's in its loop, the global
server's over its life); with ``--half``, the same for a model half the size (the memory's scaling).
A PNG of utilization against bandwidth (one line per configuration and H) and the JSON land in ``--out``.

Usage::

    geomx bench --only scale                                           # the whole grid (~40 minutes)
    python -m geomx.bench.scale --configs blocking streaming_int8 --rates 1Gbit --h 100 --out bench-results
    python -m geomx.bench.scale --configs streaming_int8 --rates 1Gbit --h 100 --path staged   # the GPU's shape
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

from ..config.units import parse_bandwidth
from ..launch import launch
from ..runs.runlog import read_stats
from .alone import run_alone
from .jobs import kill_all
from .sections import BenchPlan, Interrupted
from .tables import fmt, say, table

LATENCY = "25ms"
RATES = ("100Mbit", "1Gbit", "10Gbit")
H_VALUES = (100, 500)
FRAGMENTS = 4
OUTER = {"server_optimizer": "outer_nesterov"}
STREAMING = {"fragments": FRAGMENTS, "fragment_delay": 1, "fragment_alpha": 0.5}
CONFIGS: dict[str, dict[str, Any]] = {
    "blocking": {"fragments": 1, "training": OUTER},
    "streaming": {"fragments": FRAGMENTS, "training": {**OUTER, **STREAMING}},
    "streaming_int8": {"fragments": FRAGMENTS,
                       "training": {**OUTER, **STREAMING, "compression": {"type": "int8", "block": 256}}},
    "streaming_fp16": {"fragments": FRAGMENTS, "training": {**OUTER, **STREAMING, "compression": {"type": "fp16"}}},
    # the quality section's sparse2bit (2% of each 4096-element chunk up, 4% down), its outer step averaging
    "streaming_sparse2bit": {"fragments": FRAGMENTS, "training": {
        "server_optimizer": {"type": "outer_nesterov", "lr": 1.0, "momentum": 0.0}, **STREAMING,
        "compression": {"type": "sparse2bit", "density": 0.02, "chunk": 4096, "pull_density": 0.04}}},
}
PARTIES, RANKS = 2, 2
# FSA: a round every step (the gradients' sum each way), the optimizer (AdamW) on the ranks; at 10 Gbit/s only
FSA = {"training": {"server_optimizer": "auto"}}
FSA_STEPS = 12
FSA_RATES = ("10Gbit",)
PATHS = ("cpu", "staged")  # the round machine's host mirror: in place, or the GPU's shape (training.staged)
PLAIN_STEPS = 50  # the control's steps (no sync: a few seconds give its memory and its jitter)
HALF = "gpt43m"  # gpt85m at half its depth: the memory's scaling


def topology(path: Path, config: str, rate: str, h: int, mirror: str = "cpu") -> Path:
    """The job's topology: 2 collective parties of 2 ranks, the WAN at ``rate`` and 25 ms, HFA with K1 * K2 = H;
    ``mirror`` ``staged``: HFA's rounds through the staged host mirror (the GPU's shape of the path)."""
    spec = FSA if config == "fsa" else CONFIGS[config]
    training = {**spec["training"], **({"staged": True} if mirror == "staged" else {})}
    raw: dict[str, Any] = {
        "parties": {f"dc{p}": {"workers": RANKS, "lan": "collective"} for p in range(PARTIES)}, "central": "dc0",
        "links": {"wan": {"bandwidth": rate, "latency": LATENCY}}, "training": training,
        "timeouts": {"register": "300s", "request": "600s", "round": "600s", "shutdown": "120s"}}
    if config != "fsa":
        raw["hfa"] = {"k1": h // spec["fragments"], "k2": spec["fragments"]}
    path.write_text(yaml.safe_dump(raw))
    return path


def _worker(preset: str, steps: int, step_ms: float, out: Path, sync: str, apply_every: int = 0,
            device: str = "cpu") -> list[str]:
    """A rank's command: the stand-in's inner steps, or on ``device`` cuda the real model's (forward, backward,
    AdamW)."""
    real = ["--real", "--device", "cuda"] if device == "cuda" else []
    return [sys.executable, "-m", "geomx.bench.workers.scale_step", "--preset", preset, "--steps", str(steps),
            "--step-ms", str(step_ms), "--sync", sync, "--apply-every", str(apply_every), "--out", str(out), *real]


def summarize(ranks: list[dict[str, Any]], rounds: int) -> dict[str, Any]:
    """The ranks' files -> utilization (mean and least; and after the first outer round, whose first touches of
    memory and first outer step are the job's start-up), seconds blocked per outer round, memory."""
    from .standin import utilization

    device = [r.get("device_s", 0.0) for r in ranks]  # the landings' mixes: device work, on the stand-in's host
    shares = [utilization(r["steps"], r["step_s"], r["wall_s"], r["overrun_s"] + d)
              for r, d in zip(ranks, device, strict=True)]
    host_mix = [utilization(r["steps"], r["step_s"], r["wall_s"], r["overrun_s"]) for r in ranks]
    later = [r["durations_s"][r["steps"] // rounds:] for r in ranks] if rounds > 1 else []
    steady = [utilization(len(d), r["step_s"], sum(d)) for r, d in zip(ranks, later, strict=False) if d]
    blocked = [(r["wall_s"] - r["overrun_s"] - d - r["steps"] * r["step_s"]) / rounds
               for r, d in zip(ranks, device, strict=True)]
    model = ranks[0]["model_bytes"]
    return {"utilization": statistics.fmean(shares), "utilization_min": min(shares),
            "utilization_mix_on_host": statistics.fmean(host_mix),
            "mix_s_per_round": statistics.fmean(device) / rounds,
            "utilization_after_first_round": statistics.fmean(steady) if steady else None,
            "blocked_s_per_round": statistics.fmean(blocked), "wall_s": max(r["wall_s"] for r in ranks),
            "params": ranks[0]["params"], "model_bytes": model,
            "rank_rss_over_model": max(r["peak_rss_bytes"] for r in ranks) / model,
            "slowest_step_s": max(max(r["durations_s"]) for r in ranks),
            "overrun_s": statistics.fmean(r["overrun_s"] for r in ranks),
            # a rank's CPU time in the loop (every thread's: the sync's work, the stand-in's delta, the waits' wake-ups)
            "rank_loop_cpu_s": {part: statistics.fmean(r["loop_cpu_s"][part] for r in ranks)
                                for part in ("user", "sys")} if all("loop_cpu_s" in r for r in ranks) else None}


def measure(config: str, rate: str, h: int, rounds: int, work: Path, preset: str, step_ms: float,
            mirror: str = "cpu", device: str = "cpu") -> dict[str, Any]:
    """One run of the grid; ``error`` says why it has no figures."""
    name = f"{config}-{rate}-h{h}-{mirror}"
    out = work / name
    path = topology(work / f"{name}.yaml", config, rate, h, mirror)
    log = io.StringIO()
    result = launch(path, _worker(preset, h * rounds, step_ms, out, "geomx", device=device),
                    run_dir=work / f"run-{name}", out=log)
    files = sorted(out.glob("rank*.json"))
    if result.exit_code != 0 or len(files) != PARTIES * RANKS:
        return {"error": log.getvalue()[-2000:]}
    figures = summarize([json.loads(f.read_text()) for f in files], rounds)
    stats = read_stats(work / f"run-{name}")
    model = figures["model_bytes"]
    figures["rss_over_model"] = {s["name"]: s["peak_rss_bytes"] / model for s in stats if "peak_rss_bytes" in s}
    figures["server_cpu_s"] = {s["name"]: {"user": s["cpu_s"] - s["cpu_sys_s"], "sys": s["cpu_sys_s"]}
                               for s in stats if "server" in s["name"] and "cpu_sys_s" in s}
    far = [s for s in stats if s.get("role") == "worker" and s.get("party") != "dc0"]  # dc0 holds the global tier
    figures["far_party_wan_mb"] = {way: sum(s.get("wan", {}).get(way, 0) for s in far) / 1e6
                                   for way in ("sent", "recv")}
    if config == "fsa":  # the sync's rate: the far party's gradients up per step (INIT's model left out) / its time
        up_bits = 8 * (figures["far_party_wan_mb"]["sent"] * 1e6 - model) / rounds
        figures["sync_over_link"] = up_bits / figures["blocked_s_per_round"] / parse_bandwidth(rate)
    return {**figures, "rounds": rounds, "h": h, "rate": rate, "config": config,
            "path": _path(config, mirror, device)}


def _path(config: str, mirror: str, device: str) -> str:
    """The path a row's HFA rounds took: ``cuda``, or on the CPU ``staged`` or ``cpu`` (FSA's rounds never take the
    round machine: ``cpu`` there)."""
    return "cuda" if device == "cuda" else "cpu" if config == "fsa" else mirror


def measure_plain(steps: int, work: Path, preset: str, step_ms: float, device: str = "cpu") -> dict[str, Any]:
    """The control: the same ranks side by side with no sync (one process per rank)."""
    out = work / "plain"
    procs = [subprocess.Popen(_worker(preset, steps, step_ms, out, "none", apply_every=25, device=device),
                              env={**os.environ, "RANK": str(rank)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for rank in range(PARTIES * RANKS)]
    try:
        tails = [p.communicate(timeout=1800)[0][-1500:] for p in procs]
    finally:  # a stop (SIGINT/SIGTERM) or a time-out ends them all
        kill_all(procs)
    files = sorted(out.glob("rank*.json"))
    if any(p.returncode for p in procs) or len(files) != len(procs):
        return {"error": "\n".join(tails)}
    return {**summarize([json.loads(f.read_text()) for f in files], 1), "config": "plain"}


def measure_grid(configs: tuple[str, ...], rates: tuple[str, ...], hs: tuple[int, ...], rounds: int, out_dir: Path,
                 preset: str = "gpt85m", step_ms: float = 40.0, fsa_rates: tuple[str, ...] = (),
                 half: str | None = None, mirror: str = "cpu", device: str = "cpu") -> dict[str, Any]:
    """Every (config, rate, H), one after the other, then FSA at each of ``fsa_rates``, then the plot; with
    ``half`` (a preset half the model's size), the memory's scaling (``measure_scaling``); ``mirror``: the path
    HFA's rounds take (``PATHS``), recorded in every row as ``path``; ``device`` cuda: the real model's inner steps
    on the GPU instead of the stand-in's."""
    work = out_dir / "scale"
    work.mkdir(parents=True, exist_ok=True)
    section: dict[str, Any] = {"setup": {"preset": preset, "step_ms": step_ms, "rounds": rounds, "latency": LATENCY,
                                         "parties": PARTIES, "ranks": RANKS, "lan": "collective",
                                         "inner_step": "real (forward, backward, AdamW) on cuda" if device == "cuda"
                                         else "stand-in (a wait)", "path": _path("", mirror, device)},
                                         "rows": [], "errors": []}
    try:
        _measure_rows(section, configs, rates, hs, rounds, work, preset, step_ms, fsa_rates, mirror, device)
    except KeyboardInterrupt:  # SIGINT/SIGTERM: the rows finished so far are written, marked interrupted
        section["interrupted"] = True
        raise Interrupted(section) from None
    section["plot"] = plot(section, out_dir / "scale_utilization.png")
    if half is not None and configs:  # the best configuration measured (streaming + int8 when it ran)
        best = "streaming_int8" if "streaming_int8" in configs else configs[-1]
        try:
            section["scaling"] = measure_scaling(section, half, best, rates[0], hs[0], rounds, work, step_ms, mirror,
                                                 device)
        except KeyboardInterrupt:
            section["interrupted"] = True
            raise Interrupted(section) from None
    return section


def _measure_rows(section: dict[str, Any], configs: tuple[str, ...], rates: tuple[str, ...], hs: tuple[int, ...],
                  rounds: int, work: Path, preset: str, step_ms: float, fsa_rates: tuple[str, ...],
                  mirror: str = "cpu", device: str = "cpu") -> None:
    """``measure_grid``'s runs, each row added to ``section`` as it finishes."""
    say(f"[scale] plain: {PARTIES * RANKS} ranks, no sync ...")
    plain = measure_plain(PLAIN_STEPS, work, preset, step_ms, device=device)
    if "error" in plain:
        section["errors"].append(f"plain: {plain['error']}")
    section["plain"] = plain
    for h in hs:
        for rate in rates:
            for config in configs:
                say(f"[scale] {config}, WAN {rate} {LATENCY}, H={h}, {rounds} outer rounds, path {mirror} ...")
                row = measure(config, rate, h, rounds, work, preset, step_ms, mirror, device=device)
                if "error" in row:
                    section["errors"].append(f"{config} {rate} H={h}: {row['error']}")
                    row.update(config=config, rate=rate, h=h, path=_path(config, mirror, device))
                else:
                    say(f"[scale]   utilization {row['utilization']:.1%}, blocked {row['blocked_s_per_round']:.2f} s "
                        "per outer round")
                section["rows"].append(row)
    for rate in fsa_rates:
        say(f"[scale] fsa, WAN {rate} {LATENCY}, {FSA_STEPS} steps ...")
        row = measure("fsa", rate, 1, FSA_STEPS, work, preset, step_ms, device=device)
        if "error" in row:
            section["errors"].append(f"fsa {rate}: {row['error']}")
            row.update(config="fsa", rate=rate, h=1, path=_path("fsa", mirror, device))
        else:
            say(f"[scale]   utilization {row['utilization']:.1%}, {row['blocked_s_per_round']:.2f} s of sync per "
                f"step, {row['sync_over_link']:.0%} of the link's rate")
        section["rows"].append(row)


def measure_scaling(section: dict[str, Any], half: str, config: str, rate: str, h: int, rounds: int, work: Path,
                    step_ms: float, mirror: str = "cpu", device: str = "cpu") -> dict[str, Any]:
    """The memory of a model half the size, for the goal "a model twice the size needs at most twice the memory":
    plain and ``config`` again with preset ``half``; each size's rank peak over plain PyTorch's (the extra the sync
    costs) and the ratios of the two sizes."""
    say(f"[scale] memory's scaling: plain and {config} with {half} ...")
    (work / half).mkdir(parents=True, exist_ok=True)
    small = {"plain": measure_plain(PLAIN_STEPS, work / half, half, step_ms, device=device),
             config: measure(config, rate, h, rounds, work / half, half, step_ms, mirror, device=device)}
    large = {"plain": section.get("plain", {}),
             config: next((r for r in section["rows"] if (r["config"], r["rate"], r["h"]) == (config, rate, h)), {})}
    figures: dict[str, Any] = {"config": config, "rate": rate, "h": h, "half_preset": half, "errors": [
        f"{name} {half}: {row['error']}" for name, row in small.items() if "error" in row]}
    sizes = {}
    for name, rows in (("half", small), ("whole", large)):  # each size's figures
        if any("rank_rss_over_model" not in row for row in rows.values()):
            return figures
        model = rows["plain"]["model_bytes"]
        peak, plain = (rows[k]["rank_rss_over_model"] * model for k in (config, "plain"))
        sizes[name] = {"model_bytes": model, "rank_peak_bytes": peak, "plain_peak_bytes": plain,
                       "extra_bytes": peak - plain, "extra_over_model": (peak - plain) / model}
    figures.update(sizes)
    figures["model_ratio"] = sizes["whole"]["model_bytes"] / sizes["half"]["model_bytes"]
    figures["rank_peak_ratio"] = sizes["whole"]["rank_peak_bytes"] / sizes["half"]["rank_peak_bytes"]
    figures["extra_ratio"] = sizes["whole"]["extra_bytes"] / max(1.0, sizes["half"]["extra_bytes"])
    return figures


def plot(section: dict[str, Any], path: Path) -> str | None:
    """Utilization against bandwidth, one line per configuration and H; None when nothing was measured."""
    lines: dict[str, list[tuple[float, float]]] = {}
    for row in section["rows"]:
        if "utilization" in row and row["config"] != "fsa":
            lines.setdefault(f"{row['config']}, H={row['h']}", []).append(
                (parse_bandwidth(row["rate"]) / 1e9, row["utilization"] * 100))
    if not lines:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    for label, points in sorted(lines.items()):
        points.sort()
        axes.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
    axes.set_xscale("log")
    axes.set_xlabel("WAN bandwidth per party (Gbit/s), 25 ms one way")
    axes.set_ylabel("accelerator utilization (%)")
    setup = section["setup"]
    axes.set_title(f"{setup['preset']}, {setup['parties']} parties x {setup['ranks']} ranks, "
                   f"stand-in {setup['step_ms']:.0f} ms/step")
    axes.set_ylim(0, 101)
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return str(path)


def run(plan: BenchPlan, out_dir: Path) -> dict[str, Any]:
    """The section's entry point: quick, the two goal rows at 1 Gbit/s and H=100; else the whole grid."""
    if plan.quick:
        return measure_grid(("blocking", "streaming_int8"), ("1Gbit",), (100,), 2, out_dir, half=HALF,
                            mirror=plan.scale_path)
    return measure_grid(tuple(CONFIGS), RATES, H_VALUES, 3, out_dir, fsa_rates=FSA_RATES, half=HALF,
                        mirror=plan.scale_path)


def _cpu(spent: dict[str, float] | None) -> str:
    """CPU seconds as ``user + sys``."""
    return "-" if spent is None else f"{spent['user']:.1f} + {spent['sys']:.1f}"


def lines(section: dict[str, Any]) -> list[str]:
    """The section's table for ``geomx bench``'s report."""
    setup = section["setup"]
    plain = section.get("plain", {})
    out = [f"[scale] {setup['preset']} ({fmt(plain.get('params', 0) / 1e6 or None, '.1f', 'M')} parameters), "
           f"{setup['parties']} parties x {setup['ranks']} ranks ({setup['lan']}), inner step: "
           f"{setup['inner_step']} of {setup['step_ms']:.0f} ms, WAN latency {setup['latency']} one way, "
           f"{setup['rounds']} outer rounds per run, HFA's rounds through the {setup.get('path', 'cpu')} path",
           f"[scale] plain (no sync): utilization {fmt(plain.get('utilization'), '.1%')}, rank memory "
           f"{fmt(plain.get('rank_rss_over_model'), '.2f', 'x')} the model"]
    rows = []
    for row in section.get("rows", []):
        rss = row.get("rss_over_model", {})
        servers = [v for k, v in rss.items() if "server" in k]
        rows.append([row["config"], row["rate"], str(row["h"]), fmt(row.get("utilization"), ".1%"),
                     fmt(row.get("utilization_after_first_round"), ".1%"),
                     fmt(row.get("blocked_s_per_round"), ".2f"), fmt(row.get("mix_s_per_round"), ".2f"),
                     fmt(row.get("utilization_mix_on_host"), ".1%"),
                     " / ".join(f"{v:.0f}" for v in row.get("far_party_wan_mb", {}).values()) or "-",
                     fmt(row.get("rank_rss_over_model"), ".2f", "x"), fmt(max(servers, default=None), ".2f", "x"),
                     _cpu(row.get("rank_loop_cpu_s")), _cpu(max(row.get("server_cpu_s", {}).values(), default=None,
                                                               key=lambda cpu: cpu["user"] + cpu["sys"]))])
    out += table(["config", "WAN", "H", "utilization", "after round 1", "blocked s/round", "mix s/round",
                  "mix on host", "dc1 WAN MB up / down", "rank RSS", "global server RSS", "rank loop CPU s",
                  "global server CPU s"], rows)
    out.append("note: mix: a landing's mix into the model, device work (a GPU kernel of well under a millisecond), "
               "timed on the stand-in's host and left out of utilization; mix on host: utilization with it counted "
               "as blocked time")
    for row in section.get("rows", []):
        if row["config"] == "fsa" and "sync_over_link" in row:
            out.append(f"[scale] fsa at {row['rate']}: {row['blocked_s_per_round']:.2f} s of sync per step, the far "
                       f"party's gradients up at {row['sync_over_link']:.0%} of the link's rate")
    scaling = section.get("scaling", {})
    if "model_ratio" in scaling:
        half, whole = scaling["half"], scaling["whole"]
        out.append(f"[scale] memory's scaling ({scaling['config']}, {scaling['rate']}, H={scaling['h']}): a rank's "
                   f"extra over plain PyTorch {half['extra_bytes'] / 1e6:.0f} MB ({half['extra_over_model']:.2f}x) "
                   f"with {scaling['half_preset']}, {whole['extra_bytes'] / 1e6:.0f} MB "
                   f"({whole['extra_over_model']:.2f}x) "
                   f"with the model {scaling['model_ratio']:.2f}x its size: {scaling['extra_ratio']:.2f}x the extra,"
                   f" {scaling['rank_peak_ratio']:.2f}x the rank's peak")
    for error in scaling.get("errors", []):
        out.append(f"[scale] memory's scaling failed: {error[-300:]}")
    if section.get("plot"):
        out.append(f"[scale] plot: {section['plot']}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m geomx.bench.scale", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", nargs="*", choices=list(CONFIGS), default=list(CONFIGS))
    parser.add_argument("--rates", nargs="+", default=list(RATES))
    parser.add_argument("--h", nargs="+", type=int, default=list(H_VALUES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fsa-rates", nargs="*", default=list(FSA_RATES), help="FSA rows (none: --fsa-rates)")
    parser.add_argument("--preset", default="gpt85m")
    parser.add_argument("--step-ms", type=float, default=40.0)
    parser.add_argument("--half", default=None, help=f"a preset half the model's size: the memory's scaling ({HALF})")
    parser.add_argument("--path", choices=PATHS, default="cpu",
                        help="HFA's rounds in place (cpu) or through the staged host mirror, the GPU's shape (staged)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="cuda: the real model's forward, backward and AdamW on the GPU instead of the stand-in")
    parser.add_argument("--out", default="bench-results")
    args = parser.parse_args(argv)
    out_dir = Path(args.out)
    return run_alone("scale", lambda: measure_grid(tuple(args.configs), tuple(args.rates), tuple(args.h), args.rounds,
                                                   out_dir, args.preset, args.step_ms, tuple(args.fsa_rates), args.half,
                                                   args.path, args.device), out_dir, lines)


if __name__ == "__main__":
    sys.exit(main())
