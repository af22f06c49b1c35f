"""``geomx bench --only sync``: every synchronization algorithm on the same emulated WAN, time to a target.

The small digits CNN on the training section's emulated WAN under every synchronization algorithm (flat-PS
FSA, HiPS FSA, MixedSync, MixedSync + DCASGD, HFA, HFA + outer Nesterov, ESync), then FSA, MixedSync and
ESync with one party (ESync: one worker) 3x slower: time to a target test accuracy, total WAN bytes and
final accuracy, each against flat-PS FSA of the same scenario.

Usage::

    geomx bench --only sync --quick
    geomx bench --only sync --scenario wide     # the bandwidth-bound CNN's rows alone (full run only: not --quick)
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from .jobs import LAN, WAN, all_records, find_examples, measure, training_topology, warm_caches, write_topology
from .sections import BenchPlan
from .tables import fmt, say, table
from .targets import ratio, reach_target, summarize_sync_run
from .training import WIDE_CNN

SYNC_BASELINE = "flat_fsa"  # flat-PS FSA: the ratios' denominator in its scenario and the source of the target
SYNC_TARGET_MARGIN = 0.005  # the target is the baseline's final accuracy minus 0.5 point

SYNC_FIXED_TARGET = 0.90  # the target when the baseline did not run
BATCH_SIZE = 32
WIDE_CNN_ARGS = ("--channels", str(WIDE_CNN.channels), "--hidden", str(WIDE_CNN.hidden))  # the bandwidth-bound CNN


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
    staleness: int | None = None  # the topology's training.staleness (SSP's bound)
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


# The slowdowns: cnn.py slows a whole party (both dc1 workers), cnn_esync.py one worker (rank 3, in dc1). The
# section reads every worker's records: the master's (FSA, HFA, ESync: the global model after a global round)
# and, under MixedSync, each party's first worker's (each party's pulled model).
SLOW_PARTY = ("--slow-party", "dc1", "--slowdown", "3")
SLOW_RANK = ("--slow-rank", "3", "--slowdown", "3")


def sync_rows(quick: bool, scenarios: tuple[str, ...] = ()) -> tuple[SyncRow, ...]:
    """The section's runs: every algorithm at the same speed, then FSA, MixedSync and ESync with a slow party.

    Lengths (epochs; global rounds for HFA; rounds for ESync) are what each needs to reach flat-PS FSA's final
    accuracy minus 0.5 point with some margin (measured on 2 cores, batch 32: 11 steps per epoch): HFA with
    K1=20, K2=10 averages over the WAN every 200 local steps (18 epochs), and only its global model after a
    global round counts, so it runs a few global rounds (1000 local steps in 5); MixedSync + DCASGD runs SGD at
    lr 0.3 without momentum, the README's setting (with momentum 0.9 at lr 0.2, one run on a loaded machine
    diverged to chance accuracy in both parties and stayed there). --quick leaves out the
    slow HiPS FSA row (the slow flat-PS FSA row is the baseline) to stay near 3 minutes.
    ``scenarios``: only these scenarios' rows (empty: all; ``wide`` has none with ``quick``, which ``geomx bench``
    refuses: ``runner.check_plan``). Usage: ``sync_rows(False, ("wide",))``.
    """
    def n(full: int, short: int) -> int:
        return short if quick else full

    adam = ("--optimizer", "adam")
    same = (
        SyncRow(SYNC_BASELINE, "FSA, flat PS", "cnn.py", n(20, 10), adam, mode="flat"),
        SyncRow("hips_fsa", "FSA, HiPS", "cnn.py", n(20, 10), adam),
        SyncRow("mixedsync", "MixedSync (Adam)", "cnn.py", n(30, 15), ("--mixed-sync", *adam)),
        SyncRow("ssp", "SSP s=2 (Adam)", "cnn.py", n(20, 10), ("--ssp", *adam), staleness=2),
        SyncRow("mixedsync_dcasgd", "MixedSync + DCASGD", "cnn.py", n(40, 15),
                ("--mixed-sync", "--dcasgd", "--lr", "0.3", "--momentum", "0")),
        SyncRow("hfa", "HFA K1=20 K2=10", "cnn_hfa.py", n(5, 3), hfa=(20, 10)),
        SyncRow("hfa_outer", "HFA K1=20 K2=10 + outer", "cnn_hfa.py", n(5, 3), ("--outer",), hfa=(20, 10)),
        SyncRow("esync", "ESync K1=4", "cnn_esync.py", n(40, 25), hfa=(4, 1)),
    )
    slowed = (SYNC_BASELINE, "mixedsync", "ssp", "esync") if quick else \
        (SYNC_BASELINE, "hips_fsa", "mixedsync", "ssp", "esync")
    slow = tuple(replace(row, name=f"{row.name}_slow", scenario="slow",
                         args=(*row.args, *(SLOW_RANK if row.script == "cnn_esync.py" else SLOW_PARTY)))
                 for row in same if row.name in slowed)
    alone = tuple(replace(row, name=f"{row.name}_alone", scenario="alone", args=(*row.args, "--idle-party", "dc1"))
                  for row in same if row.name == "mixedsync")
    # The bandwidth-bound wide CNN (6.4 MB of gradients): where GeoMX's headline claim lives. Full bench only
    # (flat-PS FSA alone takes ~1.4 s a step, 2.5 minutes).
    wide = () if quick else tuple(
        replace(row, name=f"{row.name}_wide", scenario="wide", length=length, args=(*row.args, *WIDE_CNN_ARGS))
        for row in same for name, length in ((SYNC_BASELINE, 10), ("hfa", 3), ("hfa_outer", 3)) if row.name == name)
    rows = same + slow + alone + wide
    return tuple(r for r in rows if r.scenario in scenarios) if scenarios else rows


def sync_topology(row: SyncRow) -> dict[str, Any]:
    """The training section's WAN job in the row's mode, with its HFA settings.

    MixedSync's fast party leaves when it is done (the global tier lets clients leave one by one), so no
    patient shutdown timeout is needed for the slow-party rows.
    """
    raw = training_topology(row.mode)
    if row.hfa is not None:
        raw["hfa"] = {"k1": row.hfa[0], "k2": row.hfa[1]}
    if row.staleness is not None:
        raw.setdefault("training", {})["staleness"] = row.staleness
    return raw


def sync_ratios(base: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    """Baseline / row (>1: the row is faster or sends less), and the accuracy difference row - baseline."""
    return {
        "time_to_target_speedup": ratio(base.get("time_to_target_s"), row.get("time_to_target_s")),
        "wan_bytes_reduction": ratio(base["wan_bytes_total"], row["wan_bytes_total"]),
        "wan_bytes_to_target_reduction": ratio(base.get("wan_bytes_to_target"), row.get("wan_bytes_to_target")),
        "accuracy_difference": row["test_accuracy"] - base["test_accuracy"],
    }


def run(plan: BenchPlan, out_dir: Path) -> dict[str, Any]:
    """The section's entry point: every row of ``sync_rows``, then each rated against flat-PS FSA of its scenario."""
    examples = find_examples()
    chosen = sync_rows(plan.quick, plan.sync_scenarios)
    warm_caches()
    errors: list[str] = []
    jobs: dict[str, dict[str, Any]] = {}
    rows: dict[str, dict[str, Any]] = {}
    for row in chosen:
        name = f"sync-{row.name}"
        topology = write_topology(out_dir / "topologies" / f"{name}.yaml", sync_topology(row))
        command = row.command(examples, BATCH_SIZE)
        jobs[row.name] = {**asdict(row), "command": command, "topology": str(topology)}
        say(f"[sync] {name}: {row.label}, {row.length} {row.unit} "
            f"of examples/{' '.join((row.script, *row.args))} (log: {out_dir / 'logs' / name}.log) ...")
        result, figures = measure("sync", name, topology, command, out_dir, summarize_sync_run, errors,
                                  records_of=all_records)
        if figures is None:
            continue
        if any(c["global_round"] is None for p in figures["parties"].values() for c in p["curve"]):
            errors.append(f"{name}: examples/{row.script} left records without global_round: "
                          "its time to target cannot tell local models from global ones")
        rows[row.name] = figures
        say(f"[sync] {name}: {figures['steps']} steps, acc {figures['test_accuracy']:.4f}, "
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
    if baseline is None and not any(r.scenario != "wide" for r in chosen):
        rule = "the small CNN did not run (--scenario wide): see the wide CNN's target below"
    targets = {} if wide_base is None else {"wide": wide_base["test_accuracy"] - SYNC_TARGET_MARGIN}
    for row in chosen:
        if row.name not in rows:
            continue
        figures = rows[row.name]
        figures["target_accuracy"] = targets.get(row.scenario, target)
        figures.update(reach_target(figures, figures["target_accuracy"]))
        figures["time_to_090_s"] = reach_target(figures, 0.90)["time_to_target_s"]
        base = rows.get(SYNC_BASELINE if row.scenario == "same" else f"{SYNC_BASELINE}_{row.scenario}")
        if base is not None:
            figures["ratios"] = sync_ratios(base, figures)
    return {"target_accuracy": target, "target_rule": rule, "targets": targets, "batch_size": BATCH_SIZE,
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
        fast = ratio(rates[1], rates[0])
        goals["mixedsync_fast_party"] = {"alone_steps_per_s": rates[0], "with_slow_party_steps_per_s": rates[1],
                                         "ratio": fast, "within_10pct": bool(fast is not None and fast >= 0.9)}
    for name in ("mixedsync_slow", "ssp_slow", "esync_slow"):
        if name in rows and fsa:
            time = rows[name].get("time_to_target_s")
            fsa_times = [f.get("time_to_target_s") for f in fsa]
            goals[name] = {"time_to_target_s": time, "fsa_time_to_target_s": fsa_times,
                           "fsa_rows": [n for n in (f"{SYNC_BASELINE}_slow", "hips_fsa_slow") if n in rows],
                           "beats_fsa": bool(time is not None and all(t is None or time < t for t in fsa_times))}
    return goals


SCENARIOS = {"same": "same speed", "slow": "1 slow (3x)", "alone": "dc0 alone", "wide": "wide CNN"}


def lines(sync: dict[str, Any]) -> list[str]:
    """The section's table and goals for ``geomx bench``'s report."""
    rows, jobs = sync.get("rows", {}), sync.get("jobs", {})
    out = [f"[sync] the small CNN (examples/cnn*.py), 2 parties x 2 workers, WAN {WAN['bandwidth']}/s "
           f"{WAN['latency']} one way, LAN {LAN['bandwidth']}/s {LAN['latency']}, batch {sync['batch_size']}; "
           + (f"target test accuracy {sync['target_accuracy']:.4f}" if any(
               j["scenario"] != "wide" for j in sync.get("jobs", {}).values()) else "the wide CNN's target below")]
    cells = []
    for name, job in jobs.items():
        row = rows.get(name)
        scenario = SCENARIOS.get(job["scenario"], job["scenario"])
        if row is None:
            cells.append([scenario, job["label"], "failed", *["-"] * 11])
            continue
        ratios = row.get("ratios", {})
        is_base = name.startswith(SYNC_BASELINE)
        wan_to = row.get("wan_bytes_to_target")
        cells.append([
            scenario,
            job["label"],
            str(row["steps"]),
            fmt(row.get("time_to_target_s"), ".2f") if row.get("reached") else "not reached",
            fmt(row.get("global_rounds_to_target"), "d"),
            "1.00x" if is_base else fmt(ratios.get("time_to_target_speedup"), ".2f", "x"),
            fmt(row["test_accuracy"], ".4f"),
            "base" if is_base else fmt(100 * ratios["accuracy_difference"], "+.2f") if ratios else "-",
            fmt(row["wan_bytes_total"] / 1e6, ".2f"),
            "1.00x" if is_base else fmt(ratios.get("wan_bytes_reduction"), ".1f", "x"),
            ("~" if row.get("wan_bytes_to_target_estimated") else "") + fmt(None if wan_to is None else wan_to / 1e6,
                                                                              ".2f"),
            "1.00x" if is_base else fmt(ratios.get("wan_bytes_to_target_reduction"), ".1f", "x"),
            fmt(row["train_s"], ".1f"),
            fmt(row["wall_s"], ".1f"),
        ])
    out += table(["scenario", "algorithm", "steps", "to target s", "rounds @target", "speedup", "final acc",
                   "d acc pt", "WAN MB", "WAN red.", "WAN MB @target", "red. @target", "train s", "wall s"],
                  cells, left=2)
    out.append(f"note: target = {sync['target_rule']}; only the job's model counts: FSA, HFA, ESync: the global "
               "model after a global round (HFA: evaluated every K1 x K2 = 200")
    out.append("      local steps, never a party's local model); MixedSync (+ DCASGD), SSP: each party's pulled model, "
               "and to target s is the SLOWEST party's (its first record at target,")
    out.append("      its own training-loop time); a record before the first global round does not count. "
               "rounds @target = global rounds (WAN exchanges) by then: steps for FSA and")
    out.append("      MixedSync (that party's), global averages for HFA, rounds for ESync. speedup, WAN red(uction) "
               "= flat-PS FSA of the same scenario / the row;")
    out.append("      final acc = the lowest of the parties' last records; d acc pt = final acc minus that FSA's, in "
               "points; steps = the master's (local steps for HFA, ESync);")
    out.append("      WAN MB = the launcher's total (whole run); @target = the job's WAN bytes at the target record "
               "(~: no wan_mb recorded, total pro rata by records); train s = the")
    out.append("      master's loop time, wall s = launch to exit. 1 slow (3x): cnn.py --slow-party dc1 --slowdown 3 "
               "(both dc1 workers); cnn_esync.py --slow-rank 3 --slowdown 3 (one dc1 worker).")
    if "wide" in sync.get("targets", {}):
        out.append(f"      wide CNN: --channels {WIDE_CNN.channels} --hidden {WIDE_CNN.hidden} (bandwidth-bound); "
                   f"its target is its own flat-PS FSA's final accuracy minus 0.5 point: "
                   f"{sync['targets']['wide']:.4f}.")
    goals = sync.get("goals", {})
    for name, model in (("hfa_outer", "small CNN"), ("hfa_outer_wide", "wide CNN")):
        outer = goals.get(name)
        if not outer:
            continue
        speedup = outer["time_to_target_speedup"]
        out.append(f"goals ({model}): HFA + outer reaches the target {fmt(speedup, '.1f', 'x')} sooner than "
                   "flat-PS FSA "
                   f"(goal >= 20x: {'met' if outer['speedup_20x'] else 'not met'}; stretch >= 50x: "
                   f"{'met' if outer['speedup_50x'] else 'not met'}); its final accuracy is "
                   f"{-100 * outer['accuracy_loss']:+.2f} pt against FSA's (goal: loss <= 0.5 pt: "
                   f"{'met' if outer['accuracy_loss_le_0.5pt'] else 'not met'}).")
    fast = goals.get("mixedsync_fast_party")
    if fast:
        out.append(f"       MixedSync fast party (dc0): {fmt(fast['with_slow_party_steps_per_s'], '.2f')} steps/s "
                   f"beside a 3x slower dc1, {fmt(fast['alone_steps_per_s'], '.2f')} alone (dc1 idle): "
                   f"{fmt(fast['ratio'], '.2f', 'x')} "
                   f"(goal >= 0.90x: {'met' if fast['within_10pct'] else 'not met'}).")
    for name, label in (("mixedsync_slow", "MixedSync"), ("ssp_slow", "SSP s=2"), ("esync_slow", "ESync")):
        goal = goals.get(name)
        if goal:
            fsa = ", ".join(f"{'HiPS' if n.startswith('hips') else 'flat PS'} "
                            + ("not reached" if t is None else f"{t:.2f} s")
                            for n, t in zip(goal["fsa_rows"], goal["fsa_time_to_target_s"], strict=True))
            out.append(f"       1 slow (3x): {label} {fmt(goal['time_to_target_s'], '.2f', ' s')} to target "
                       f"against FSA ({fsa}): {'beats' if goal['beats_fsa'] else 'does not beat'} FSA.")
    for error in sync.get("errors", []):
        out.append(f"error: {error}")
    return out
