"""Integration worker for ESync: local steps as assigned by the state server, one worker's device 3x slower.

Runs on HFA with K2 = 1 (every round is global); K1 from the topology is the slowest worker's step count.
Records the assignments it received and how long each round's local computation took.
"""

from __future__ import annotations

import argparse
import time

import jobkit
import torch
import torch.nn.functional as F

import geomx


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--slow-rank", type=int, default=3)
    parser.add_argument("--step-s", type=float, default=0.04,
                        help="emulated device time per local step (a sleep: the model itself is tiny)")
    parser.add_argument("--slowdown", type=float, default=3.0, help="the slow rank's device is this many times slower")
    args = parser.parse_args()
    kv = geomx.kv.create("dist_sync")
    assert kv.hfa is not None and kv.hfa.k2 == 1, "ESync runs on HFA with K2 = 1"
    rank = kv.global_rank
    torch.manual_seed(jobkit.seed_for(rank))
    model = jobkit.make_model()
    params = list(model.parameters())
    if kv.is_master_worker:
        kv.set_optimizer(geomx.optim.SGD(lr=1.0))  # global_lr = 1.0
    kv.init(list(range(len(params))), [p.data for p in params])
    local = torch.optim.SGD(params, lr=jobkit.LR)
    inputs, targets = jobkit.make_data(16, kv.num_all_workers)
    steps, assigned, compute_s, done = kv.hfa.k1, [], [], 0
    for _ in range(args.rounds):
        started = time.monotonic()
        for _ in range(steps):
            time.sleep(args.step_s * (args.slowdown if rank == args.slow_rank else 1.0))
            local.zero_grad()
            F.mse_loss(model(inputs[done % 16, rank]), targets[done % 16, rank]).backward()
            local.step()
            done += 1
        compute_s.append(time.monotonic() - started)
        per_step = compute_s[-1] / steps
        for idx, param in enumerate(params):
            kv.push(idx, param.data / kv.num_workers)
        for idx, param in enumerate(params):
            kv.pull(idx, param.data)
        steps = kv.assign_local_steps(per_step, base_steps=kv.hfa.k1)
        assigned.append(steps)
    jobkit.save_worker_output(kv.config.run_dir, rank, {"final": [p.detach().clone() for p in params]},
                              {"assigned": assigned, "compute_s": compute_s, "local_steps": done})
    kv.close()


if __name__ == "__main__":
    jobkit.run_and_exit(main)
