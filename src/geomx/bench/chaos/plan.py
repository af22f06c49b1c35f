"""The chaos scenarios' shared parts: the plan, the topologies, the worker's arguments, one job run, a party's own
launch, and the arithmetic over the ranks' records (``rank<r>.json``, written by ``geomx.bench.workers.chaos``).

Usage::

    plan = ChaosPlan(steps=40)
    run = run_variant("slow-alone", plan, topology(plan, PARTIES[:2], None), -1, [], out_dir, python_command)
"""

from __future__ import annotations

import itertools
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...launch import LaunchResult
from ...runs.runlog import read_stats
from ..jobs import run_job, write_topology
from ..quality import Command
from ..quality_rows import OUTER

WORKER = Path(__file__).parents[1] / "workers" / "chaos.py"
PARTIES = ("dc0", "dc1", "dc2")
SLOW = "dc2"  # the slowed, lost or restarted party of every scenario but global_restart


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
    heartbeat_s: float = 3.0  # party_lost, rank_lost, global_restart: how long a silent node has before it is dead
    collective_ranks: int = 2  # rank_lost: the ranks of dc2, a collective party under its own torchrun
    rank_lost_quorum: int | None = 2  # rank_lost's rounds: decoupled, as party_lost's (None: synchronous)
    checkpoint_rounds: int = 2  # global_restart: a checkpoint every this many global rounds (K1 x K2 steps each)
    baselines: bool = True  # the fault-free jobs the loss ratios compare against (a test leaves them out)

    @property
    def outer_every(self) -> int:
        return self.hfa[0] * self.hfa[1]

    @property
    def slow_steps(self) -> int:
        """The slow party's steps: a whole number of outer steps, about ``steps / slowdown``."""
        rounds = max(1, round(self.steps / self.slowdown / self.outer_every))
        return rounds * self.outer_every

    @property
    def checkpoint_steps(self) -> int:
        """global_restart's checkpoint interval in steps (``every_steps`` counts global rounds under HFA)."""
        return self.checkpoint_rounds * self.outer_every


QUICK = ChaosPlan(steps=200)
FULL = ChaosPlan()


def topology(plan: ChaosPlan, parties: tuple[str, ...], quorum: int | None) -> dict[str, Any]:
    """``parties`` of one worker each, DiLoCo's outer optimizer at the quality section's momentum (0.5: at the
    paper's 0.9 a delta folded in a round late cost rank_lost's decoupled job 25% of its loss, at 0.5 4%;
    benchmarks/README.md), and a quorum when given."""
    training: dict[str, Any] = {"server_optimizer": dict(OUTER["server_optimizer"])}
    if quorum is not None:
        training.update(quorum=quorum, grace=plan.grace, stale_rounds=math.ceil(plan.slowdown))
    return {"parties": {name: {"workers": 1} for name in parties}, "central": parties[0], "global_servers": 1,
            "hfa": {"k1": plan.hfa[0], "k2": plan.hfa[1]}, "training": training, "status": False,
            "timeouts": {"register": "120s", "request": "300s", "round": "300s", "shutdown": "60s"}}


def with_heartbeat(raw: dict[str, Any], plan: ChaosPlan) -> dict[str, Any]:
    """``raw`` whose silent nodes are declared dead after ``plan.heartbeat_s`` (heartbeats every 0.25 s)."""
    raw["timeouts"].update(heartbeat=f"{plan.heartbeat_s:g}s", heartbeat_interval="0.25s")
    return raw


def worker_args(plan: ChaosPlan, out: Path, slow_rank: int, world: int = len(PARTIES)) -> list[str]:
    """The chaos worker's arguments for the plan; ``slow_rank`` -1: nobody slowed. Every job of three parties of
    one worker splits batches three ways, so a rank's step costs the same whoever else is in the job."""
    return ["--out", str(out), "--steps", str(plan.steps), "--world", str(world), "--batch-size",
            str(plan.batch_size), "--preset", plan.preset, "--step-s", str(plan.step_s), "--slow-rank", str(slow_rank),
            "--slowdown", str(plan.slowdown)]


def fresh(out: Path) -> Path:
    """``out`` without the files of an earlier run of the same job (rank files, a fault's note)."""
    for stale in [*out.glob("rank*.json"), *out.glob("fault*.json")]:
        stale.unlink()
    return out


def read_ranks(out: Path) -> dict[int, dict[str, Any]]:
    """Each rank's ``rank<r>.json``; RuntimeError when none was written."""
    ranks = {int(p.stem.removeprefix("rank")): json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))}
    if not ranks:
        raise RuntimeError(f"no rank wrote its timing into {out}")
    return ranks


def read_fault(out: Path) -> dict[str, Any]:
    """The fault the worker noted before causing it (``fault.json``: its step and wall clock); RuntimeError if none
    did."""
    path = out / "fault.json"
    if not path.exists():
        raise RuntimeError(f"the fault never happened: no {path}")
    return dict(json.loads(path.read_text()))


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


def first_step_at(record: dict[str, Any]) -> float | None:
    """When a rank's first step ended, on the wall clock; None if it made none."""
    ends = record.get("step_ends") or []
    return record["started_at"] + ends[0] if ends else None


def steps_per_s(ranks: dict[int, dict[str, Any]], fast: list[int]) -> float:
    """The mean steps per second of the ``fast`` ranks."""
    rates = [ranks[r]["steps"] / ranks[r]["seconds"] for r in fast if r in ranks and ranks[r]["seconds"] > 0]
    if not rates:
        raise RuntimeError(f"no timing from the ranks {fast}")
    return sum(rates) / len(rates)


def ratio(value: float | None, base: float | None) -> float | None:
    """``value / base``, None where either is missing (a baseline left out)."""
    return value / base if value is not None and base else None


def run_variant(name: str, plan: ChaosPlan, raw: dict[str, Any], slow_rank: int, extra: list[str], out_dir: Path,
                command: Command, world: int = len(PARTIES)) -> dict[str, Any]:
    """One whole job of a scenario on the topology ``raw`` (``slow_rank`` -1: nobody slowed; ``extra``: more worker
    arguments): its ranks' timing and the others' steps per second."""
    job = f"chaos-{name}"
    out = fresh(out_dir / "ranks" / job)
    path = write_topology(out_dir / "topologies" / f"{job}.yaml", raw)
    result, _ = run_job(job, path, command(WORKER, [*worker_args(plan, out, slow_rank, world), *extra]), out_dir)
    if result.exit_code != 0:
        raise RuntimeError(f"{job} failed ({result.failed}); see {out_dir / 'runs' / job}")
    ranks = read_ranks(out)
    fast = [r for r in ranks if r != slow_rank]
    rounds = [entry["outer_rounds"] for entry in read_stats(out_dir / "runs" / job) if "outer_rounds" in entry]
    return {"steps_per_s": steps_per_s(ranks, fast), "longest_stall_s": longest_stall_s(ranks, fast),
            "wall_s": result.wall_s, "val_loss": ranks[0].get("val_loss"),
            "ranks": without_step_ends(ranks), "outer_rounds": rounds[0]["by_party"] if rounds else None}


def launch_party(label: str, party: str, path: Path, command: list[str], address: str, out_dir: Path,
                 results: dict[str, LaunchResult], ended: dict[str, float] | None = None,
                 resume: bool = False, section: str = "chaos") -> None:
    """``geomx launch --party PARTY --global-scheduler ADDRESS`` (``--resume``), as on the party's own host
    (``run_job``, its log ``SECTION-LABEL``): its result into ``results[label]``, and the wall clock it returned at
    into ``ended[label]``."""
    results[label], _ = run_job(f"{section}-{label}", path, command, out_dir, party=party, global_scheduler=address,
                                resume=resume)
    if ended is not None:
        ended[label] = time.time()
