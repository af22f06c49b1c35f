"""The ``party_lost`` and ``rank_lost`` scenarios: dc2 killed whole and started again by hand, or one rank of dc2
(a collective party under its own ``torchrun --max-restarts 1``) killed and the party restarted by torchrun's
elastic agent; what it costs the others, how soon dc2 contributes again, and the final loss (the package's face).

Usage::

    record = rank_lost(ChaosPlan(steps=150), Path("out"))
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ...launch import LaunchResult
from ..jobs import free_port, write_topology
from ..quality import Command, python_command
from .plan import (
    PARTIES,
    SLOW,
    WORKER,
    ChaosPlan,
    first_outer_at,
    fresh,
    launch_party,
    longest_stall_s,
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

REJOINED = "rejoins in place of the one declared dead"  # the global scheduler's line for each member replaced
DISAGREE = "disagree on the model"  # its line for parties whose model digests differ at a step


def start_others(label: str, path: Path, command: list[str], address: str, out_dir: Path,
                 results: dict[str, LaunchResult]) -> list[threading.Thread]:
    """dc0 (with the global tier, at ``address``) and dc1, each launched on its own in a thread."""
    threads = [threading.Thread(target=launch_party, args=(f"{label}-{party}", party, path, command, address,
                                                           out_dir, results)) for party in PARTIES[:2]]
    for thread in threads:
        thread.start()
    return threads


def join_others(threads: list[threading.Thread], results: dict[str, LaunchResult], plan: ChaosPlan,
                scenario: str, out_dir: Path, skip: tuple[str, ...] = ()) -> None:
    """Wait for dc0's and dc1's launches; RuntimeError naming what failed (``skip``: labels that were meant to)."""
    for thread in threads:
        thread.join(timeout=plan.timeout_s)
    failed = [f"{label} ({r.failed})" for label, r in results.items() if label not in skip and r.exit_code != 0]
    if failed or any(thread.is_alive() for thread in threads):
        raise RuntimeError(f"{scenario}: {', '.join(failed) or 'dc0/dc1 did not end'}; see {out_dir / 'logs'}")


def run_party_lost(plan: ChaosPlan, out_dir: Path, command: Command) -> dict[str, Any]:
    """dc2 killed (every process, SIGKILL) a quarter into the run and started again ``restart_after_s`` later,
    each party launched on its own as on its own host; dc2 goes on from where it died for two outer steps."""
    out = fresh(out_dir / "ranks" / "chaos-lost")
    path = write_topology(out_dir / "topologies" / "chaos-lost.yaml", with_heartbeat(topology(plan, PARTIES, 2), plan))
    address = f"127.0.0.1:{free_port()}"
    args = worker_args(plan, out, -1)
    die_step = plan.steps // 4 // plan.outer_every * plan.outer_every + plan.hfa[0]  # between two outer steps
    results: dict[str, LaunchResult] = {}
    others = start_others("lost", path, command(WORKER, args), address, out_dir, results)
    launch_party("lost-dc2", SLOW, path, command(WORKER, [*args, "--die-step", str(die_step)]), address, out_dir,
                 results)  # returns once dc2's processes are dead
    time.sleep(plan.restart_after_s)  # the scenario's outage, not a wait for anything
    restarted_at = time.time()
    launch_party("lost-rejoined", SLOW, path, command(WORKER, [*args, "--start-step", str(die_step), "--stop-after",
                                                               str(2 * plan.outer_every)]), address, out_dir, results)
    join_others(others, results, plan, "party_lost", out_dir, skip=("lost-dc2",))
    ranks = read_ranks(out)
    first = first_outer_at(ranks.get(PARTIES.index(SLOW), {}), plan.outer_every)  # the restarted worker's
    return {"steps_per_s": steps_per_s(ranks, [0, 1]), "others_stalled_s": longest_stall_s(ranks, [0, 1]),
            "rejoin_s": None if first is None else first - restarted_at, "val_loss": ranks[0].get("val_loss"),
            "die_step": die_step, "ranks": without_step_ends(ranks)}


def party_lost(plan: ChaosPlan, out_dir: Path, command: Command = python_command) -> dict[str, Any]:
    """The ``party_lost`` record: the fault-free decoupled job beside the one that loses dc2 (the package's face)."""
    baseline = run_variant("lost-baseline", plan, topology(plan, PARTIES, 2), -1, [], out_dir, command) \
        if plan.baselines else None
    lost = run_party_lost(plan, out_dir, command)
    return {"scenario": "party_lost", "others_stalled_s": lost["others_stalled_s"], "rejoin_s": lost["rejoin_s"],
            "val_loss_ratio": ratio(lost["val_loss"], baseline and baseline["val_loss"]),
            "runs": {"baseline": baseline, "lost": lost},
            "goal": {"others_stalled_s": 10.0, "rejoin_s": 30.0, "val_loss_ratio": 1.02}}


def rank_lost_topology(plan: ChaosPlan) -> dict[str, Any]:
    """party_lost's three parties, dc2 a collective party of ``collective_ranks`` ranks, under ``rank_lost_quorum``
    (None: synchronous rounds)."""
    raw = with_heartbeat(topology(plan, PARTIES, plan.rank_lost_quorum), plan)
    raw["parties"][SLOW] = {"workers": plan.collective_ranks, "lan": "collective"}
    return raw


def torchrun_party(plan: ChaosPlan, path: Path, address: str, args: list[str], out_dir: Path) -> int | None:
    """dc2's ranks under ``torchrun --standalone --max-restarts 1`` (docs/collective.md's recipe), as on the party's
    own host; its output into OUT/logs/chaos-ranklost-dc2.log. torchrun's exit code (None: it ran past
    ``timeout_s`` and was killed). Every rank starts cold (``python worker.py``): torchrun's agent watches it."""
    run_dir = out_dir / "runs" / "chaos-ranklost-dc2"
    shutil.rmtree(run_dir, ignore_errors=True)
    env = {**os.environ, "GEOMX_TOPOLOGY": str(path.resolve()), "GEOMX_PARTY": SLOW, "GEOMX_GLOBAL_SCHEDULER": address,
           "GEOMX_HOST": "127.0.0.1", "GEOMX_RUN_DIR": str(run_dir.resolve()),
           "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={plan.collective_ranks}", "--max-restarts=1", str(WORKER), *args]
    log_path = out_dir / "logs" / "chaos-ranklost-dc2.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            return proc.wait(timeout=plan.timeout_s)
        except subprocess.TimeoutExpired:
            return None
        finally:
            if proc.poll() is None:  # timed out, or a Ctrl-C: the agent and its ranks go too
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def run_rank_lost(plan: ChaosPlan, out_dir: Path, command: Command) -> dict[str, Any]:
    """dc0 and dc1 launched each on its own, dc2 under its own torchrun; dc2's last rank SIGKILLs itself between two
    outer steps after the first global round, torchrun restarts the party's ranks, which go on from that step."""
    out = fresh(out_dir / "ranks" / "chaos-ranklost")
    path = write_topology(out_dir / "topologies" / "chaos-ranklost.yaml", rank_lost_topology(plan))
    address = f"127.0.0.1:{free_port()}"
    world = len(PARTIES) - 1 + plan.collective_ranks
    collective = list(range(len(PARTIES) - 1, world))  # dc2's global ranks: after dc0's and dc1's workers
    args = worker_args(plan, out, -1, world)
    die_step = plan.outer_every + plan.hfa[0]  # after the first global round, between two outer steps
    results: dict[str, LaunchResult] = {}
    others = start_others("ranklost", path, command(WORKER, args), address, out_dir, results)
    code = torchrun_party(plan, path, address, [*args, "--die-step", str(die_step), "--lose-rank",
                                                str(collective[-1])], out_dir)
    join_others(others, results, plan, "rank_lost", out_dir)
    if code != 0:
        raise RuntimeError(f"rank_lost: dc2's torchrun {'timed out' if code is None else f'exited {code}'}; "
                           f"see {out_dir / 'logs' / 'chaos-ranklost-dc2.log'}")
    ranks = read_ranks(out)
    fault = read_fault(out)
    again = [ranks[r] for r in collective if r in ranks and ranks[r].get("attempt", 0) > 0]
    if len(again) != len(collective):
        raise RuntimeError(f"rank_lost: dc2's restarted ranks wrote {len(again)} records of {len(collective)}")
    firsts = [first_outer_at(record, plan.outer_every) for record in again]
    dc0_log = (out_dir / "logs" / "chaos-ranklost-dc0.log").read_text()
    return {"steps_per_s": steps_per_s(ranks, [0, 1]), "others_stalled_s": longest_stall_s(ranks, [0, 1]),
            "restart_s": min(record["started_at"] for record in again) - fault["at"],
            "rejoin_s": None if None in firsts else max(f for f in firsts if f is not None) - fault["at"],
            "val_loss": ranks[0].get("val_loss"), "die_step": die_step, "lost_rank": collective[-1],
            "rejoined_members": dc0_log.count(REJOINED), "digest_warnings": dc0_log.count(DISAGREE),
            "ranks": without_step_ends(ranks)}


def rank_lost(plan: ChaosPlan, out_dir: Path, command: Command = python_command) -> dict[str, Any]:
    """The ``rank_lost`` record: the fault-free job (dc2's ranks started by ``geomx launch``) beside the one whose
    dc2 loses a rank under torchrun (the package's face)."""
    world = len(PARTIES) - 1 + plan.collective_ranks
    baseline = run_variant("ranklost-baseline", plan, rank_lost_topology(plan), -1, [], out_dir, command, world) \
        if plan.baselines else None
    lost = run_rank_lost(plan, out_dir, command)
    rounds = "synchronous" if plan.rank_lost_quorum is None else f"quorum {plan.rank_lost_quorum}"
    return {"scenario": "rank_lost", "rounds": rounds, "others_stalled_s": lost["others_stalled_s"],
            "rejoin_s": lost["rejoin_s"], "restart_s": lost["restart_s"],
            "val_loss_ratio": ratio(lost["val_loss"], baseline and baseline["val_loss"]),
            "runs": {"baseline": baseline, "lost": lost},
            "goal": {"others_stalled_s": 10.0, "rejoin_s": 30.0, "val_loss_ratio": 1.02}}
