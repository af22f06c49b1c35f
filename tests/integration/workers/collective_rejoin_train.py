"""Integration worker of the collective rejoin test: a plain PyTorch loop under ``gx.DistributedOptimizer`` (HFA
from the topology) that a collective party's rank leaves by dying, and a restarted party's ranks rejoin.

Roles, by flags:
  --die-rank R --die-step N   global rank R exits at step N without a goodbye (its party's other ranks then fail
                              at their next collective)
  --until-file PATH           train until PATH exists (at most --max-steps), then --after more steps: the survivor
  --rejoined-file PATH        after the wrapper's init, create PATH: a restarted party's rank 0
  --torchrun-restarts         the party runs under ``torchrun --max-restarts``: rank R dies by SIGKILL, in torchrun's
                              first attempt only, and rank 0 of a later attempt (the agent's restart) writes
                              --rejoined-file

Every worker that ends writes ``out/worker<rank>.pt/.json`` (jobkit): its weights before and after init, the
job's model after every step that changed it (``job_models``), and its final weights.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from pathlib import Path

import jobkit
import torch
import torch.nn.functional as F

import geomx.torch as gx


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--die-rank", type=int, default=-1)
    parser.add_argument("--die-step", type=int, default=6)
    parser.add_argument("--until-file")
    parser.add_argument("--max-steps", type=int, default=2000)
    parser.add_argument("--after", type=int, default=10)
    parser.add_argument("--rejoined-file")
    parser.add_argument("--step-seconds", type=float, default=0.02, help="emulated compute time per step")
    parser.add_argument("--torchrun-restarts", action="store_true")
    args = parser.parse_args()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))  # the restarts torchrun's agent made so far
    restarted = args.torchrun_restarts and attempt > 0
    rank, num_workers = gx.worker_place()
    torch.manual_seed(jobkit.seed_for(rank) + (1000 if args.rejoined_file else 0) + attempt)
    model = jobkit.make_model()
    before = [p.detach().clone() for p in model.parameters()]
    opt = gx.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=jobkit.LR), model)
    after = [p.detach().clone() for p in model.parameters()]
    if args.rejoined_file and int(os.environ.get("RANK", "0")) == 0 and restarted == args.torchrun_restarts:
        Path(args.rejoined_file).write_text(str(time.time()))
    steps = jobkit.SurvivorSteps(args.steps, args.until_file, args.max_steps, args.after)
    inputs, targets = jobkit.make_data(steps.total, num_workers)
    job = jobkit.make_model()
    job_models: list[list[torch.Tensor]] = []
    done = 0
    for step in steps:
        if rank == args.die_rank and step == args.die_step and not restarted:
            if args.torchrun_restarts:
                os.kill(os.getpid(), signal.SIGKILL)
            os._exit(3)  # a crash: no goodbye to anyone
        time.sleep(args.step_seconds)
        opt.zero_grad()
        F.mse_loss(model(inputs[step, rank]), targets[step, rank]).backward()
        opt.step()
        done += 1
        opt.load_job_model(job)
        current = [p.detach().clone() for p in job.parameters()]
        if not job_models or any(not torch.equal(a, b) for a, b in zip(current, job_models[-1], strict=True)):
            job_models.append(current)
    opt.close()
    jobkit.save_worker_output(opt.kv.config.run_dir, rank,
                              {"before_init": before, "after_init": after, "final": [p.detach().clone()
                                                                                     for p in model.parameters()],
                               "job_models": [t for m in job_models for t in m]},
                              {"name": opt.kv.name, "steps": done, "job_models": len(job_models)})


if __name__ == "__main__":
    jobkit.run_and_exit(main)
