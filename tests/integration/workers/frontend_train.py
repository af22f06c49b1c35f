"""Integration worker: jobkit's model and data trained by a plain PyTorch loop wrapped in DistributedOptimizer.

The algorithm comes from the topology's ``training`` block / GEOMX_* variables, as for any user. Saves the
weights before and after the wrapper's init and at the end, plus a report (the plan, the overlap counters)
to ``$GEOMX_RUN_DIR/out/worker<global rank>.*``.
"""

from __future__ import annotations

import argparse

import jobkit
import torch
import torch.nn.functional as F
from torch import nn

import geomx.torch as gx


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=jobkit.STEPS)
    parser.add_argument("--optimizer", choices=["sgd", "adam", "adamw"], default="sgd")
    parser.add_argument("--lr", type=float, default=jobkit.LR)
    parser.add_argument("--momentum", type=float, default=jobkit.MOMENTUM, help="for --optimizer sgd")
    parser.add_argument("--mismatch-rank", type=int, default=-1, help="this global rank builds a wider model")
    parser.add_argument("--hidden", type=int, default=jobkit.HIDDEN)
    args = parser.parse_args()
    rank, num_workers = gx.worker_place()
    torch.manual_seed(jobkit.seed_for(rank))  # deliberately different per worker: the wrapper's init fixes it
    hidden = args.hidden + (1 if rank == args.mismatch_rank else 0)
    model = nn.Sequential(nn.Linear(jobkit.IN_FEATURES, hidden), nn.ReLU(), nn.Linear(hidden, jobkit.OUT_FEATURES))
    before = [p.detach().clone() for p in model.parameters()]
    if args.optimizer == "sgd":
        inner: torch.optim.Optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    elif args.optimizer == "adam":
        inner = torch.optim.Adam(model.parameters(), lr=args.lr)
    else:
        inner = torch.optim.AdamW(model.parameters(), lr=args.lr)
    opt = gx.DistributedOptimizer(inner, model)
    after = [p.detach().clone() for p in model.parameters()]
    inputs, targets = jobkit.make_data(args.steps, num_workers)
    for step in range(args.steps):  # the user's loop, unchanged
        opt.zero_grad()
        loss = F.mse_loss(model(inputs[step, rank]), targets[step, rank])
        loss.backward()
        opt.step()
        opt.log(loss=loss)
    opt.close()  # the last updates land (under ESync: the last round runs here)
    final = [p.detach().clone() for p in model.parameters()]
    jobkit.save_worker_output(opt.kv.config.run_dir, rank, {"before_init": before, "after_init": after, "final": final},
                              {"name": opt.kv.name, "global_rank": rank, "is_master_worker": opt.is_master_worker,
                               "mode": opt.plan.mode.name, "overlap": opt.overlap})


if __name__ == "__main__":
    main()
