"""The ``global_restart`` scenario: the global tier (global scheduler and server, in the central party dc0) killed,
the job ending everywhere, and the job launched again with ``--resume`` from its checkpoint (the package's face).

Usage::

    record = global_restart(ChaosPlan(steps=40), Path("out"))
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path
from typing import Any

from ...launch import LaunchResult
from ...runs.checkpoint import load_latest
from ..jobs import free_port, write_topology
from ..quality import Command, python_command
from .plan import (
    PARTIES,
    WORKER,
    ChaosPlan,
    first_step_at,
    fresh,
    launch_party,
    ratio,
    read_fault,
    read_ranks,
    run_variant,
    steps_per_s,
    topology,
    with_heartbeat,
    without_step_ends,
    worker_args,
)


def restart_topology(plan: ChaosPlan, folder: Path) -> dict[str, Any]:
    """The three parties under synchronous rounds, checkpointing into ``folder`` every ``checkpoint_rounds`` (its
    absolute path: a relative one would be taken from the topology file's folder)."""
    raw = with_heartbeat(topology(plan, PARTIES, None), plan)
    raw["checkpoint"] = {"dir": str(folder.resolve()), "every_steps": plan.checkpoint_rounds, "keep": 3}
    return raw


def kill_step(plan: ChaosPlan) -> int:
    """Where the global tier dies: three quarters of a checkpoint interval past the last checkpoint before the middle
    of the run (at least the first), between two outer steps where the interval allows."""
    interval = plan.checkpoint_steps
    return max(1, plan.steps // 2 // interval) * interval + interval * 3 // 4


def launch_job(label: str, path: Path, command: list[str], out_dir: Path, plan: ChaosPlan,
               resume: bool = False) -> tuple[dict[str, LaunchResult], dict[str, float]]:
    """Every party launched on its own (``geomx launch --party``, dc0 with the global tier at a new address), as on
    its own host; each launch's result and the wall clock it ended at."""
    address = f"127.0.0.1:{free_port()}"
    results: dict[str, LaunchResult] = {}
    ended: dict[str, float] = {}
    threads = [threading.Thread(target=launch_party, args=(f"{label}-{party}", party, path, command, address,
                                                           out_dir, results, ended, resume)) for party in PARTIES]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=plan.timeout_s)
    if any(thread.is_alive() for thread in threads):
        raise RuntimeError(f"global_restart: the {label} job did not end within {plan.timeout_s:g} s; see "
                           f"{out_dir / 'logs'}")
    return results, ended


def run_global_restart(plan: ChaosPlan, out_dir: Path, command: Command) -> dict[str, Any]:
    """The job whose global tier dies at ``kill_step``, then the same job resumed from its newest checkpoint."""
    out = fresh(out_dir / "ranks" / "chaos-restart")
    folder = out_dir / "checkpoints" / "chaos-restart"
    shutil.rmtree(folder, ignore_errors=True)
    path = write_topology(out_dir / "topologies" / "chaos-restart.yaml", restart_topology(plan, folder))
    args = worker_args(plan, out, -1)
    step = kill_step(plan)
    if step >= plan.steps:
        raise RuntimeError(f"global_restart: {plan.steps} steps end before the kill at step {step}")
    crashed, ended = launch_job("restart", path, command(WORKER, [*args, "--kill-global-step", str(step)]), out_dir,
                                plan)
    fault = read_fault(out)
    gone_at = max(ended.values())
    snapshot = load_latest(folder, 0)  # before the resumed job writes its own
    checkpoint = None if snapshot is None else snapshot.step * plan.outer_every  # HFA: global rounds x K1 x K2
    resumed, _ = launch_job("resumed", path, command(WORKER, args), out_dir, plan, resume=True)
    failed = [f"{label} ({r.failed})" for label, r in resumed.items() if r.exit_code != 0]
    if failed:
        raise RuntimeError(f"global_restart: the resumed job failed: {', '.join(failed)}; see {out_dir / 'logs'}")
    ranks = read_ranks(out)
    starts = {r: record["start_step"] for r, record in ranks.items()}
    first = first_step_at(ranks[0])
    return {"kill_step": fault["step"], "checkpoint_step": checkpoint, "start_steps": starts, "resumed_at": starts[0],
            "steps_lost": fault["step"] - starts[0], "gone_s": {label: t - fault["at"] for label, t in ended.items()},
            "all_gone_s": gone_at - fault["at"], "crashed_exit": {label: r.exit_code for label, r in crashed.items()},
            "resume_s": None if first is None else first - fault["at"],
            "relaunch_s": None if first is None else first - gone_at,
            "steps_per_s": steps_per_s(ranks, list(ranks)), "val_loss": ranks[0].get("val_loss"),
            "ranks": without_step_ends(ranks)}


def global_restart(plan: ChaosPlan, out_dir: Path, command: Command = python_command) -> dict[str, Any]:
    """The ``global_restart`` record: the fault-free job beside the one killed and resumed (the package's face)."""
    baseline = None
    if plan.baselines:
        folder = out_dir / "checkpoints" / "chaos-restart-baseline"
        shutil.rmtree(folder, ignore_errors=True)
        baseline = run_variant("restart-baseline", plan, restart_topology(plan, folder), -1, [], out_dir, command)
    restarted = run_global_restart(plan, out_dir, command)
    return {"scenario": "global_restart", "steps_lost": restarted["steps_lost"],
            "checkpoint_steps": plan.checkpoint_steps, "resume_s": restarted["resume_s"],
            "all_gone_s": restarted["all_gone_s"],
            "val_loss_ratio": ratio(restarted["val_loss"], baseline and baseline["val_loss"]),
            "runs": {"baseline": baseline, "restarted": restarted},
            "goal": {"steps_lost": plan.checkpoint_steps, "val_loss_ratio": 1.02}}

