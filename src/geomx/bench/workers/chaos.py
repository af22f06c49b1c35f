"""Bench worker of ``geomx bench --only chaos``: the quality section's character transformer and batches, with
emulated device time per step and one rank made slower, each rank timing its own steps.

Every step trains the zoo's charlm on the rank's part of the global batch (``geomx.bench.workers.quality``'s
batches, rate schedule and optimizer) through the PyTorch wrapper, reports its samples (``opt.step(tokens=)``,
which decoupled rounds weigh by), then sleeps ``--step-s`` (the accelerator this 2-core machine does not have: the
model is tiny, so without it the parties' relative speed would follow the machine's load). ``--slow-rank``'s steps
take ``--slowdown`` times as long as its own would (compute and emulated time together). Each rank writes
``OUT/rank<global rank>.json``: ``{"rank", "steps", "seconds", "step_ends"}`` (seconds from its first step's start
to its last step's end; ``step_ends``: each step's end, from the same origin; ``started_at``: the wall clock at
that origin, so that a step's end is ``started_at + step_ends[i]``; ``start_step``: the job's step it began at;
``attempt``: torchrun's restarts before this life), and the master worker adds ``val_loss``: the job's model at the
end on the quality section's validation windows.

Faults, each noted first in ``OUT/fault.json`` (``{"step", "rank", "at"}``, the wall clock) where a scenario needs
its time: ``--die-step`` kills the worker's whole party at that step (``party_lost``); with ``--lose-rank R`` only
global rank R dies, by SIGKILL of itself, in torchrun's first attempt, and the ranks of torchrun's next attempt
(``TORCHELASTIC_RESTART_COUNT`` > 0) go on from ``--die-step`` (``rank_lost``); ``--kill-global-step`` makes the
master worker SIGKILL the global scheduler and global servers before that step, in a job not resumed
(``global_restart``: the job is then resumed from its checkpoint, and every worker goes on from ``opt.start_step``).

Usage::

    geomx launch chaos.yaml -- python -m geomx.bench.workers.chaos --out OUT --steps 200 --slow-rank 2
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import torch.nn.functional as F

from geomx.bench.workers.quality import global_batches, learning_rate, make_optimizer, prepare, rank_part
from geomx.cluster.processes import job_processes
from geomx.zoo.charlm import VOCAB, evaluate

GLOBAL_TIER = ("global_scheduler", "global_server")  # GEOMX_ROLE of the central party's global processes


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="the folder each rank writes rank<r>.json into")
    parser.add_argument("--preset", default="tiny", help="a shape of geomx.zoo.charlm.PRESETS")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=16, help="windows per rank per step")
    parser.add_argument("--world", type=int, default=3, help="ranks in the job (each takes its part of a batch)")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--max-chars", type=int, default=1_000_000)
    parser.add_argument("--eval-windows", type=int, default=256)
    parser.add_argument("--step-s", type=float, default=0.1, help="emulated device time per step (a sleep)")
    parser.add_argument("--slow-rank", type=int, default=-1, help="the global rank made slower (-1: none)")
    parser.add_argument("--slowdown", type=float, default=3.0, help="how many times slower its steps are")
    parser.add_argument("--slow-steps", type=int, default=None, help="the slow rank's steps (default: --steps)")
    parser.add_argument("--start-step", type=int, default=0,
                        help="go on from this step (a restarted party: its batches and rate from there)")
    parser.add_argument("--stop-after", type=int, default=None, help="train at most this many steps")
    parser.add_argument("--die-step", type=int, default=-1,
                        help="after this many steps, SIGKILL every process of this worker's party, itself last")
    parser.add_argument("--lose-rank", type=int, default=-1,
                        help="with --die-step: only this global rank dies, in torchrun's first attempt; the ranks of "
                             "its next attempt go on from --die-step")
    parser.add_argument("--kill-global-step", type=int, default=-1,
                        help="the master worker SIGKILLs the global tier before this step (a job not resumed)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.schedule, args.optimizer, args.weight_decay = "cosine", "adamw", 0.01  # quality's optimizer and schedule
    return args


def main(argv: list[str] | None = None) -> None:
    import geomx.torch as gx

    args = parse_args(argv)
    train_windows, val, model = prepare(args)
    inner = make_optimizer(args, model)
    opt = gx.DistributedOptimizer(inner, model)
    rank = opt.global_rank
    slow = rank == args.slow_rank
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))  # torchrun's restarts of this party so far
    restarted = args.lose_rank >= 0 and attempt > 0
    first = opt.start_step or (args.die_step if restarted else args.start_step)  # resumed, restarted, or told
    inputs, targets = train_windows.tensors()
    step_ends: list[float] = []
    started_at, started = time.time(), time.monotonic()
    steps = args.slow_steps if slow and args.slow_steps is not None else args.steps
    last = steps if args.stop_after is None else min(steps, first + args.stop_after)
    batches = itertools.islice(global_batches(len(train_windows), args.batch_size * args.world, steps, args.seed),
                               first, last)
    for done, batch in enumerate(batches):
        step = first + done
        if done == args.die_step and not restarted:
            fault(args, opt, step)
        if step == args.kill_global_step and opt.is_master_worker and opt.start_step == 0:
            kill_global_tier(args, opt, step)
        began = time.monotonic()
        mine = rank_part(batch, rank, args.world)
        for group in inner.param_groups:
            group["lr"] = learning_rate(args, step * args.steps // steps)  # the same schedule over fewer steps
        loss = F.cross_entropy(model(inputs[mine]).reshape(-1, VOCAB), targets[mine].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step(tokens=len(mine))
        opt.log(loss=loss)
        own = time.monotonic() - began + args.step_s  # this step's time at full speed
        time.sleep(own * args.slowdown - (time.monotonic() - began) if slow else args.step_s)
        step_ends.append(time.monotonic() - started)
    record: dict[str, object] = {"rank": rank, "steps": len(step_ends), "seconds": step_ends[-1] if step_ends else 0.0,
                                 "step_ends": [round(t, 4) for t in step_ends], "slow": slow,
                                 "started_at": started_at, "start_step": first, "attempt": attempt}
    if opt.is_master_worker:
        held = copy.deepcopy(model)
        opt.load_job_model(held)
        record["val_loss"], record["accuracy"] = evaluate(held, val, max(1, args.eval_windows // 64), 64)
    opt.close()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{rank}.json").write_text(json.dumps(record))


def note_fault(out: str, step: int, rank: int) -> None:
    """``OUT/fault.json``: the step, the rank and the wall clock of the fault about to happen."""
    Path(out).mkdir(parents=True, exist_ok=True)
    Path(out, "fault.json").write_text(json.dumps({"step": step, "rank": rank, "at": time.time()}))


def fault(args: argparse.Namespace, opt: Any, step: int) -> None:
    """``--die-step``'s fault: this worker's whole party (``party_lost``), or this rank alone if it is
    ``--lose-rank`` (``rank_lost``; the party's other ranks go on until torchrun's agent stops them)."""
    if args.lose_rank < 0:
        kill_party(opt.kv.config.run_dir, opt.kv.config.party)
    elif opt.global_rank == args.lose_rank:
        note_fault(args.out, step, opt.global_rank)
        os.kill(os.getpid(), signal.SIGKILL)


def kill_global_tier(args: argparse.Namespace, opt: Any, step: int) -> None:
    """SIGKILL the global scheduler and every global server of this job (the central party's run folder): the job
    then ends everywhere, this worker's next global round failing with it."""
    note_fault(args.out, step, opt.global_rank)
    for pid, env in job_processes({str(opt.kv.config.run_dir)}).items():
        if env.get("GEOMX_ROLE") in GLOBAL_TIER:
            os.kill(pid, signal.SIGKILL)


def kill_party(run_dir: str | None, party: str) -> None:
    """SIGKILL every process of ``party`` in this job's run folder, this one last: a data center lost at once."""
    for pid, env in job_processes({str(run_dir)}).items():
        if env.get("GEOMX_PARTY") == party and pid != os.getpid():
            os.kill(pid, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)  # by pid: a warm-forked worker's environment is its server's, not its own


if __name__ == "__main__":
    main()
