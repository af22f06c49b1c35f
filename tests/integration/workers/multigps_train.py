"""Integration worker for MultiGPS: the Bi-Sparse MLP loop of compressed_train.py with any number of global servers.

Every worker pushes its gradient, pulls the aggregate and steps a local SGD on the mean. Saves the final
weights; the master also saves each global server's received and sent bytes (from kv.stats()).
"""

from __future__ import annotations

import argparse
import json

import jobkit
import torch
import torch.nn.functional as F
from compressed_train import teacher_data
from torch import nn

import geomx


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--compression", default="null", help="JSON spec, or null for dense")
    parser.add_argument("--lr", type=float, default=jobkit.LR)
    args = parser.parse_args()
    spec = json.loads(args.compression)
    kv = geomx.kv.create("dist_sync")
    rank = kv.global_rank
    torch.manual_seed(jobkit.seed_for(rank))
    model = nn.Sequential(nn.Linear(jobkit.IN_FEATURES, args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, jobkit.OUT_FEATURES))
    params = list(model.parameters())
    if kv.is_master_worker and spec is not None:
        kv.set_gradient_compression(spec)
    kv.init(list(range(len(params))), [p.data for p in params])
    local = torch.optim.SGD(params, lr=args.lr)
    inputs, targets = teacher_data(args.steps, kv.num_all_workers)
    for step in range(args.steps):
        local.zero_grad()
        F.mse_loss(model(inputs[step, rank]), targets[step, rank]).backward()
        for idx, param in enumerate(params):
            kv.push(idx, param.grad, priority=-idx)
        for idx, param in enumerate(params):
            kv.pull(idx, param.grad, priority=-idx)
            param.grad /= kv.num_all_workers
        local.step()
    kv.barrier()
    per_server = {}
    if kv.is_master_worker:
        (body,) = kv.stats()["servers"].values()
        per_server = {name: {"recv": gs["lan"]["recv"] + gs["wan"]["recv"]} for name, gs in body["upstream"].items()}
    infos = [kv._keys[i] for i in range(len(params))]
    jobkit.save_worker_output(kv.config.run_dir, rank, {"final": [p.detach().clone() for p in params]},
                              {"global_servers": per_server, "slices": [len(info.slices) for info in infos],
                               "shards": [info.shards for info in infos]})
    kv.close()


if __name__ == "__main__":
    jobkit.run_and_exit(main)
