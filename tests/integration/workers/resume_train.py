"""Integration worker of the resume tests: jobkit's model and data in a plain loop wrapped in DistributedOptimizer
(Adam: an optimizer with state), from the step the job resumes at (``opt.start_step``) to ``--steps``.

``--kill-step K``: the worker of global rank 0 SIGKILLs the job's global server before its step K (a crash after
the checkpoints of the steps before it; first waiting for the global server's checkpoint of ``--wait-checkpoint``
rounds, which it writes in the background, and with ``--wait-worker R:S`` for worker R's checkpoint of its step S:
a party that has finished), then fails. Every worker that ends writes ``out/worker<rank>.pt/.json``
(jobkit): its final weights and the step it started at.
"""

from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path

import jobkit
import torch
import torch.nn.functional as F
from survive_train import find_pid, wait_for_checkpoint, wait_for_file

import geomx.torch as gx
from geomx.torch.checkpoint import worker_dir

LR = 0.01


def adam_steps(optimizer: torch.optim.Optimizer) -> int | None:
    """The steps Adam's state counts (a resumed state goes on counting from its checkpoint's); None if it has none
    (the optimizer runs on the global servers)."""
    state = optimizer.state.get(optimizer.param_groups[0]["params"][0])
    return int(state["step"]) if state else None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--kill-step", type=int, default=-1)
    parser.add_argument("--wait-checkpoint", type=int, default=0)
    parser.add_argument("--wait-worker", default="", help="R:S, worker R's checkpoint of step S")
    args = parser.parse_args()
    rank, num_workers = gx.worker_place()
    torch.manual_seed(jobkit.seed_for(rank))  # different per worker: the master's INIT (or checkpoint) wins
    model = jobkit.make_model()
    opt = gx.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=LR), model)
    run_dir = Path(opt.kv.config.run_dir or ".")
    after_init = [p.detach().clone() for p in model.parameters()]  # the model the job (re)starts from
    adam_start = adam_steps(opt.optimizer)  # None on a fresh start; a resumed inner Adam's count
    inputs, targets = jobkit.make_data(args.steps, num_workers)
    for step in range(opt.start_step, args.steps):
        if step == args.kill_step and rank == 0:
            if args.wait_checkpoint:
                folder = opt.kv.config.topology.checkpoint.dir
                assert folder is not None
                wait_for_checkpoint(folder, args.wait_checkpoint)
                if args.wait_worker:
                    other, other_step = (int(part) for part in args.wait_worker.split(":"))
                    wait_for_file(worker_dir(folder, other) / f"ckpt-{other_step:09d}.json")
            os.kill(find_pid(run_dir, "global_server"), signal.SIGKILL)
            raise SystemExit(f"killed the global server before step {step}")
        opt.zero_grad()
        F.mse_loss(model(inputs[step, rank]), targets[step, rank]).backward()
        opt.step()
    opt.close()
    jobkit.save_worker_output(run_dir, rank, {"final": [p.detach().clone() for p in model.parameters()],
                                                    "after_init": after_init},
                              {"start_step": opt.start_step, "plan": opt.plan.describe(),
                               "adam_start": adam_start, "adam_steps": adam_steps(opt.optimizer)})


if __name__ == "__main__":
    jobkit.run_and_exit(main)
