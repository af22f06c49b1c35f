"""Integration worker: MixedSync + DCASGD with one worker per party, every step recorded for a replay.

Each worker saves, per step and key, the weights it computed its gradient on (``held``), the gradient it
pushed and the weights the server answered with (``received``). The test rebuilds the order in which the
global server applied the pushes and replays the paper's update (one backup per party: what it received).
dc1 computes its first gradient on the INIT weights, then waits (bounded) until dc0 has finished two steps:
so its first push is certainly stale, and only a backup seeded at INIT compensates it.
"""

from __future__ import annotations

import argparse
import time

import jobkit
import torch
import torch.nn.functional as F

import geomx

LR = 0.1
LAMDA = 20.0  # large (MXNet: 0.04), so that a wrong backup shows far above float32 rounding


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    kv = geomx.kv.create("dist_async")
    rank = kv.global_rank
    torch.manual_seed(jobkit.seed_for(rank))
    model = jobkit.make_model()
    params = list(model.parameters())
    if kv.is_master_worker:
        kv.set_optimizer(geomx.optim.DCASGD(lr=LR, lamda=LAMDA, rescale_grad=1.0))
    kv.init(list(range(len(params))), [p.data for p in params])
    inputs, targets = jobkit.make_data(args.steps, kv.num_all_workers)
    run_dir = kv.config.run_dir
    assert run_dir is not None
    marker = run_dir / "dc0-two-steps"
    record: dict[str, list[torch.Tensor]] = {}
    for step in range(args.steps):
        record.update({f"held/{step}/{i}": p.detach().clone() for i, p in enumerate(params)})
        model.zero_grad()
        F.mse_loss(model(inputs[step, rank]), targets[step, rank]).backward()
        if kv.party == "dc1" and step == 0:
            deadline = time.monotonic() + 60.0
            while not marker.exists():  # dc0's pushes must move the weights before dc1's first push
                if time.monotonic() > deadline:
                    raise TimeoutError("dc0 did not finish two steps within 60 s")
                time.sleep(0.01)
        for idx, param in enumerate(params):
            record[f"grad/{step}/{idx}"] = param.grad.detach().clone()
            kv.push(idx, param.grad)
        for idx, param in enumerate(params):
            kv.pull(idx, param.data)
            record[f"received/{step}/{idx}"] = param.detach().clone()
        if kv.party == "dc0" and step == 1:
            marker.write_text("done")
    names = sorted(record)
    jobkit.save_worker_output(run_dir, rank, {"values": [record[n] for n in names]},
                              {"party": kv.party, "steps": args.steps, "names": names, "lr": LR, "lamda": LAMDA})
    kv.barrier()
    kv.close()


if __name__ == "__main__":
    jobkit.run_and_exit(main)
