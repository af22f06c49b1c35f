"""``geomx bench --only chaos``: what a slow data center costs the others, with decoupled outer rounds and without.

Three parties of one worker each (``lan: server``), the quality section's character transformer and batches
(``geomx.bench.workers.chaos``), DiLoCo's rounds (HFA, K1 x K2 local steps, outer Nesterov on the global servers),
emulated device time per step so that the parties' speeds follow the scenario rather than the machine's load.
Scenarios, each a record:

* ``slow_party``: dc2's steps 3x slower. Three jobs side by side: ``decoupled`` (``training.quorum: 2``, grace
  ``auto``: a round closes with the two fast parties, dc2's deltas fold into a later one), ``synchronous`` (today's
  rounds: every party waits for dc2 at each global round) and ``alone`` (dc0 and dc1 without dc2). ``goodput``: the
  fast parties' steps per second in ``decoupled`` over ``alone``; ``goodput_synchronous``: the same for
  ``synchronous``. Goal (issue 49): goodput >= 0.85 (synchronous: about 1/3).
* ``party_lost``: each party launched on its own (``geomx launch --party``, as on its own host), decoupled rounds
  (quorum 2); every process of dc2 gets SIGKILL between two outer steps a quarter into the run, and dc2 is started
  again ``restart_after_s`` (10 s) after its launcher saw it die, going on from the step where it died for two
  outer steps. ``others_stalled_s``: the longest time dc0 or dc1 went without a step beyond its median step;
  ``rejoin_s``: from the restart to the end of the restarted party's first outer step (its first contribution);
  ``val_loss_ratio``: the job's final validation loss against the same job without the fault (dc0 and dc1 train
  the same steps in both). Goals: others stalled <= 10 s, rejoin <= 30 s, the loss within 2%.

Under decoupled rounds the slow party trains ``steps / slowdown`` steps, so that it ends about when the others do
(a party that trained on alone after the others left would have no quorum to close its rounds); its deltas arrive
up to ``slowdown`` rounds late, so ``stale_rounds`` is the slowdown rounded up: they are folded in, not dropped.
Under synchronous rounds it trains as many steps as the others: every global round waits for it (with fewer, the
others would run free once it left).

Usage::

    geomx bench --only chaos --quick
    python -m geomx.bench.chaos            # bench-results/chaos.json and the table
    record = slow_party(ChaosPlan(steps=40), Path("out"))
"""

from __future__ import annotations

import itertools
import json
import math
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..launch import LaunchResult
from ..runs.runlog import read_stats
from .jobs import free_port, load_avg, run_job, write_topology
from .quality import Command, python_command
from .sections import BenchPlan, Interrupted
from .tables import fmt, say, table, write_and_print

WORKER = Path(__file__).parent / "workers" / "chaos.py"
PARTIES = ("dc0", "dc1", "dc2")
SLOW = "dc2"


@dataclass(frozen=True)
class ChaosPlan:
    """The scenarios' shared settings: the one place they are chosen.

    ``steps`` per fast party at ``step_s`` of emulated device time each (0.1 s: the tiny model's own ~20 ms step
    on one core is then a small part of it, so three parties' workers and servers on two loaded cores keep their
    relative speeds); HFA's K1 x K2 = 5 x 2 (an outer step every 10 steps; K2 > 1 lets a party go on from its own
    average while a decoupled round is out)."""

    steps: int = 300
    step_s: float = 0.1
    slowdown: float = 3.0
    hfa: tuple[int, int] = (5, 2)
    batch_size: int = 16
    preset: str = "tiny"
    timeout_s: float = 600.0
    grace: str = "auto"  # decoupled rounds' grace window (a test sets 0: the slow party then misses every round)
    restart_after_s: float = 10.0  # party_lost: the lost party's outage
    heartbeat_s: float = 3.0  # party_lost: how long a silent party has before it is declared dead

    @property
    def outer_every(self) -> int:
        return self.hfa[0] * self.hfa[1]

    @property
    def slow_steps(self) -> int:
        """The slow party's steps: a whole number of outer steps, about ``steps / slowdown``."""
        rounds = max(1, round(self.steps / self.slowdown / self.outer_every))
        return rounds * self.outer_every


QUICK = ChaosPlan(steps=200)
FULL = ChaosPlan()


def topology(plan: ChaosPlan, parties: tuple[str, ...], quorum: int | None) -> dict[str, Any]:
    """``parties`` of one worker each, DiLoCo's outer optimizer, and a quorum when given."""
    training: dict[str, Any] = {"server_optimizer": "outer_nesterov"}
    if quorum is not None:
        training.update(quorum=quorum, grace=plan.grace, stale_rounds=math.ceil(plan.slowdown))
    return {"parties": {name: {"workers": 1} for name in parties}, "central": parties[0], "global_servers": 1,
            "hfa": {"k1": plan.hfa[0], "k2": plan.hfa[1]}, "training": training, "status": False,
            "timeouts": {"register": "120s", "request": "300s", "round": "300s", "shutdown": "60s"}}


def worker_args(plan: ChaosPlan, out: Path, slow_rank: int) -> list[str]:
    """The chaos worker's arguments for the plan; ``slow_rank`` -1: nobody slowed. Every job splits batches three
    ways, so a rank's step costs the same whoever else is in the job."""
    return ["--out", str(out), "--steps", str(plan.steps), "--world", str(len(PARTIES)), "--batch-size",
            str(plan.batch_size), "--preset", plan.preset, "--step-s", str(plan.step_s), "--slow-rank", str(slow_rank),
            "--slowdown", str(plan.slowdown)]


def fresh(out: Path) -> Path:
    """``out`` without the rank files of an earlier run of the same job."""
    for stale in out.glob("rank*.json"):
        stale.unlink()
    return out


def read_ranks(out: Path) -> dict[int, dict[str, Any]]:
    """Each rank's ``rank<r>.json``; RuntimeError when none was written."""
    ranks = {int(p.stem.removeprefix("rank")): json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))}
    if not ranks:
        raise RuntimeError(f"no rank wrote its timing into {out}")
    return ranks


def longest_stall_s(ranks: dict[int, dict[str, Any]], fast: list[int]) -> float:
    """The longest time any of the ``fast`` ranks went without finishing a step, beyond its median step: where
    it waited for others."""
    stalls = [0.0]
    for rank in fast:
        ends = ranks.get(rank, {}).get("step_ends") or []
        gaps = sorted(b - a for a, b in itertools.pairwise(ends))
        if gaps:
            stalls.append(max(gaps) - gaps[len(gaps) // 2])
    return max(stalls)


def without_step_ends(ranks: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """The ranks' records for bench.json: every figure but each step's end."""
    return {r: {k: v for k, v in record.items() if k != "step_ends"} for r, record in ranks.items()}


def first_outer_at(record: dict[str, Any], outer_every: int) -> float | None:
    """When a rank's first outer step ended (its first contribution had left), on the wall clock; None if it made
    none. ``step_ends`` count from ``started_at``."""
    ends = record.get("step_ends") or []
    return record["started_at"] + ends[outer_every - 1] if len(ends) >= outer_every else None


def steps_per_s(ranks: dict[int, dict[str, Any]], fast: list[int]) -> float:
    """The mean steps per second of the ``fast`` ranks."""
    rates = [ranks[r]["steps"] / ranks[r]["seconds"] for r in fast if r in ranks and ranks[r]["seconds"] > 0]
    if not rates:
        raise RuntimeError(f"no timing from the ranks {fast}")
    return sum(rates) / len(rates)


def run_variant(name: str, plan: ChaosPlan, parties: tuple[str, ...], quorum: int | None, slow: bool,
                out_dir: Path, command: Command) -> dict[str, Any]:
    """One job of a scenario: its ranks' timing and the fast ranks' steps per second."""
    job = f"chaos-{name}"
    out = fresh(out_dir / "ranks" / job)
    path = write_topology(out_dir / "topologies" / f"{job}.yaml", topology(plan, parties, quorum))
    slow_rank = parties.index(SLOW) if slow else -1
    args = worker_args(plan, out, slow_rank)
    if slow and quorum is not None:  # decoupled: the slow rank's own step count (one command for every rank)
        args += ["--slow-steps", str(plan.slow_steps)]
    result, _ = run_job(job, path, command(WORKER, args), out_dir)
    if result.exit_code != 0:
        raise RuntimeError(f"{job} failed ({result.failed}); see {out_dir / 'runs' / job}")
    ranks = read_ranks(out)
    fast = [r for r in ranks if r != slow_rank]
    rounds = [entry["outer_rounds"] for entry in read_stats(out_dir / "runs" / job) if "outer_rounds" in entry]
    return {"steps_per_s": steps_per_s(ranks, fast), "longest_stall_s": longest_stall_s(ranks, fast),
            "wall_s": result.wall_s, "val_loss": ranks[0].get("val_loss"),
            "ranks": without_step_ends(ranks), "outer_rounds": rounds[0]["by_party"] if rounds else None}


def slow_party(plan: ChaosPlan, out_dir: Path, command: Command = python_command) -> dict[str, Any]:
    """The ``slow_party`` record (see the module docstring)."""
    runs = {"decoupled": run_variant("slow-decoupled", plan, PARTIES, 2, True, out_dir, command),
            "synchronous": run_variant("slow-synchronous", plan, PARTIES, None, True, out_dir, command),
            "alone": run_variant("slow-alone", plan, PARTIES[:2], None, False, out_dir, command)}
    base = runs["alone"]["steps_per_s"]
    return {"scenario": "slow_party", "goodput": runs["decoupled"]["steps_per_s"] / base,
            "goodput_synchronous": runs["synchronous"]["steps_per_s"] / base, "runs": runs,
            "goal": {"goodput": 0.85}}


def launch_party(label: str, party: str, path: Path, command: list[str], address: str, out_dir: Path,
                 results: dict[str, LaunchResult]) -> None:
    """``geomx launch --party PARTY --global-scheduler ADDRESS``, as on the party's own host (``run_job``)."""
    results[label], _ = run_job(f"chaos-lost-{label}", path, command, out_dir, party=party, global_scheduler=address)


def run_party_lost(plan: ChaosPlan, out_dir: Path, command: Command) -> dict[str, Any]:
    """dc2 killed (every process, SIGKILL) a quarter into the run and started again ``restart_after_s`` later,
    each party launched on its own as on its own host; dc2 goes on from where it died for two outer steps."""
    out = fresh(out_dir / "ranks" / "chaos-lost")
    raw = topology(plan, PARTIES, 2)
    raw["timeouts"].update(heartbeat=f"{plan.heartbeat_s:g}s", heartbeat_interval="0.25s")
    path = write_topology(out_dir / "topologies" / "chaos-lost.yaml", raw)
    address = f"127.0.0.1:{free_port()}"
    args = worker_args(plan, out, -1)
    die_step = plan.steps // 4 // plan.outer_every * plan.outer_every + plan.hfa[0]  # between two outer steps
    results: dict[str, LaunchResult] = {}
    others = [threading.Thread(target=launch_party, args=(party, party, path, command(WORKER, args), address,
                                                          out_dir, results)) for party in PARTIES[:2]]
    for thread in others:
        thread.start()
    launch_party("lost", SLOW, path, command(WORKER, [*args, "--die-step", str(die_step)]), address, out_dir,
                 results)  # returns once dc2's processes are dead
    time.sleep(plan.restart_after_s)  # the scenario's outage, not a wait for anything
    restarted_at = time.time()
    launch_party("rejoined", SLOW, path, command(WORKER, [*args, "--start-step", str(die_step), "--stop-after",
                                                          str(2 * plan.outer_every)]), address, out_dir, results)
    for thread in others:
        thread.join(timeout=plan.timeout_s)
    failed = [f"{label} ({r.failed})" for label, r in results.items() if label != "lost" and r.exit_code != 0]
    if failed or any(thread.is_alive() for thread in others):
        raise RuntimeError(f"party_lost: {', '.join(failed) or 'dc0/dc1 did not end'}; see {out_dir / 'logs'}")
    ranks = read_ranks(out)
    first = first_outer_at(ranks.get(PARTIES.index(SLOW), {}), plan.outer_every)  # the restarted worker's
    return {"steps_per_s": steps_per_s(ranks, [0, 1]), "others_stalled_s": longest_stall_s(ranks, [0, 1]),
            "rejoin_s": None if first is None else first - restarted_at, "val_loss": ranks[0].get("val_loss"),
            "die_step": die_step, "ranks": without_step_ends(ranks)}


def party_lost(plan: ChaosPlan, out_dir: Path, command: Command = python_command) -> dict[str, Any]:
    """The ``party_lost`` record: the fault-free decoupled job beside the one that loses dc2 (module docstring)."""
    baseline = run_variant("lost-baseline", plan, PARTIES, 2, False, out_dir, command)
    lost = run_party_lost(plan, out_dir, command)
    return {"scenario": "party_lost", "others_stalled_s": lost["others_stalled_s"], "rejoin_s": lost["rejoin_s"],
            "val_loss_ratio": lost["val_loss"] / baseline["val_loss"] if baseline["val_loss"] else None,
            "runs": {"baseline": baseline, "lost": lost},
            "goal": {"others_stalled_s": 10.0, "rejoin_s": 30.0, "val_loss_ratio": 1.02}}


SCENARIOS = {"slow_party": slow_party, "party_lost": party_lost}


def measure(names: tuple[str, ...], plan: ChaosPlan, out_dir: Path,
            command: Command = python_command) -> dict[str, Any]:
    """Run the named scenarios at ``plan``; the section's dict (``run``'s). ``command(script, args)``: how a job's
    workers start the worker script (a test forks them warm)."""
    unknown = sorted(set(names) - set(SCENARIOS))
    if unknown:
        raise ValueError(f"unknown chaos scenarios {unknown}; valid: {', '.join(SCENARIOS)}")
    out_dir.mkdir(parents=True, exist_ok=True)
    section: dict[str, Any] = {"plan": asdict(plan), "records": {}, "errors": [], "load_avg_start": load_avg()}
    try:
        for name in names:
            say(f"[chaos] {name} ...")
            try:
                section["records"][name] = SCENARIOS[name](plan, out_dir, command)
            except RuntimeError as exc:
                section["errors"].append(f"{name}: {exc}")
                say(f"[chaos] {name} FAILED: {exc}")
    except KeyboardInterrupt:
        section["interrupted"] = True
        raise Interrupted(section) from None
    section["load_avg_end"] = load_avg()
    return section


def run(plan: BenchPlan, out_dir: Path) -> dict[str, Any]:
    """The section's entry point: every scenario, at ``QUICK`` or ``FULL``."""
    return measure(tuple(SCENARIOS), QUICK if plan.quick else FULL, out_dir)


def lines(section: dict[str, Any]) -> list[str]:
    """The section's table for ``geomx bench``'s report."""
    p = section["plan"]
    out = [f"[chaos] 3 parties x 1 worker, charlm {p['preset']}, {p['steps']} steps of {p['step_s']} s emulated "
           f"device time, HFA {p['hfa'][0]}x{p['hfa'][1]} + outer Nesterov; load avg {section.get('load_avg_start')}"
           f" -> {section.get('load_avg_end')}"]
    cells = []
    for record in section["records"].values():
        runs, goal = record["runs"], record["goal"]
        if record["scenario"] == "slow_party":
            order = ("alone", "decoupled", "synchronous")
            cells += [["slow_party", "goodput", fmt(record["goodput"], ".3f"), f">= {goal['goodput']:g}",
                       f"synchronous {fmt(record['goodput_synchronous'], '.3f')}"],
                      ["", "steps/s alone / decoupled / sync",
                       " / ".join(fmt(runs[v]["steps_per_s"], ".2f") for v in order), "", ""],
                      ["", "longest stall s", " / ".join(fmt(runs[v].get("longest_stall_s"), ".1f") for v in order),
                       "", ""],
                      ["", "val loss", " / ".join(fmt(runs[v]["val_loss"], ".3f") for v in order), "", ""]]
        elif record["scenario"] == "party_lost":
            cells += [["party_lost", "others_stalled_s", fmt(record["others_stalled_s"], ".1f"),
                       f"<= {goal['others_stalled_s']:g}", ""],
                      ["", "rejoin_s", fmt(record["rejoin_s"], ".1f"), f"<= {goal['rejoin_s']:g}", ""],
                      ["", "val_loss_ratio", fmt(record["val_loss_ratio"], ".4f"), f"<= {goal['val_loss_ratio']:g}",
                       f"{fmt(runs['lost']['val_loss'], '.3f')} against {fmt(runs['baseline']['val_loss'], '.3f')}"]]
    out += table(["scenario", "measure", "measured", "goal", "beside it"], cells)
    out += [f"error: {e}" for e in section.get("errors", [])]
    return out


if __name__ == "__main__":  # chosen scenarios at FULL (--quick: QUICK): bench-results/chaos.json and the table
    chosen = tuple(a for a in sys.argv[1:] if not a.startswith("--")) or tuple(SCENARIOS)
    write_and_print("chaos", measure(chosen, QUICK if "--quick" in sys.argv else FULL, Path("bench-results")),
                    Path("bench-results"), lines)
