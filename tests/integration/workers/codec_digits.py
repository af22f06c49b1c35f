"""Integration worker: the digits CNN trained with a WAN codec, under FSA (GeoMX's Bi-Sparse loop) or HFA.

``--sync fsa``: servers only sum; every worker pushes its gradient, pulls the aggregate into it and steps a
local optimizer on the mean (examples/cnn_bsc.py's loop). ``--sync hfa``: local Adam steps, and every K1
steps push ``param / num_workers`` and pull the party's (every K2-th time the global) average model
(examples/cnn_hfa.py's loop); the topology carries ``hfa``. ``--sync mixed``: MixedSync (``dist_async``), the
global server runs ``--optimizer`` at ``--lr`` on each party's push as it arrives, workers pull the weights
(examples/cnn.py --mixed-sync's loop). The master sets ``--compression`` (JSON).
Every worker saves its final test accuracy in its report.

Usage (inside a job)::

    python codec_digits.py --sync hfa --compression '{"type": "bsc", "threshold": 0.01}' --epochs 6
"""

from __future__ import annotations

import argparse
import json

import jobkit
import torch
import torch.nn.functional as F

import geomx
from geomx.zoo.data import digits_split, steps_per_epoch
from geomx.zoo.models import DigitsCNN, accuracy


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sync", choices=["fsa", "hfa", "mixed"], default="fsa")
    parser.add_argument("--compression", default="null", help="JSON codec spec, or null for dense")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--optimizer", choices=["adam", "sgd"], default="adam")
    parser.add_argument("--lr", type=float, default=0.003)
    args = parser.parse_args()
    spec = json.loads(args.compression)
    kv = geomx.kv.create("dist_async" if args.sync == "mixed" else "dist_sync")
    if (args.sync == "hfa") != (kv.hfa is not None):
        raise SystemExit(f"--sync {args.sync} needs a topology {'with' if args.sync == 'hfa' else 'without'} hfa")
    rank = kv.global_rank
    torch.manual_seed(1000 * rank)
    model = DigitsCNN()
    params = list(model.parameters())
    if kv.is_master_worker and spec is not None:
        kv.set_gradient_compression(spec)
    if kv.is_master_worker and args.sync == "mixed":
        kv.set_optimizer(geomx.optim.Adam(lr=args.lr) if args.optimizer == "adam" else geomx.optim.SGD(lr=args.lr))
    kv.init(list(range(len(params))), [p.data for p in params])
    local = (torch.optim.Adam(params, lr=args.lr) if args.optimizer == "adam"
             else torch.optim.SGD(params, lr=args.lr))
    train, test = digits_split()
    shard = train.shard(rank, kv.num_all_workers)
    steps = steps_per_epoch(len(train), kv.num_all_workers, args.batch_size)
    step = 0
    for epoch in range(args.epochs):
        for images, labels in shard.batches(args.batch_size, epoch, steps, seed=rank):
            local.zero_grad()
            F.cross_entropy(model(images), labels).backward()
            step += 1
            if args.sync == "mixed":  # the global server steps; the workers pull its weights
                for idx, param in enumerate(params):
                    kv.push(idx, param.grad, priority=-idx)
                for idx, param in enumerate(params):
                    kv.pull(idx, param.data, priority=-idx)
            elif kv.hfa is None:  # FSA: the aggregated gradient, then a local step
                for idx, param in enumerate(params):
                    kv.push(idx, param.grad, priority=-idx)
                for idx, param in enumerate(params):
                    kv.pull(idx, param.grad, priority=-idx)
                    param.grad /= kv.num_all_workers
                local.step()
            else:  # HFA: a local step, and every K1 steps a model average
                local.step()
                if step % kv.hfa.k1 == 0:
                    for idx, param in enumerate(params):
                        kv.push(idx, param.data / kv.num_workers, priority=-idx)
                    for idx, param in enumerate(params):
                        kv.pull(idx, param.data, priority=-idx)
    report = {"accuracy": accuracy(model, test.images, test.labels), "steps": step}
    jobkit.save_worker_output(kv.config.run_dir, rank, {}, report)
    kv.close()


if __name__ == "__main__":
    jobkit.run_and_exit(main)
