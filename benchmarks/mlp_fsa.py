"""The seeds' FSA loop on the digits MLP 64-1024-1024-10 (4.5 MB of float32 gradients: bandwidth-bound).

Forward, backward, push every gradient, pull every parameter; the global server runs SGD with momentum.
The master worker records the mean seconds per step after ``--warmup`` steps (``kv.record``: the
launcher's summary and ``RUN/metrics/`` show it) and its final test accuracy. Run it through the launcher:

    geomx launch topologies/demo.yaml -- python benchmarks/mlp_fsa.py --steps 40

``benchmarks/duplex_link.py`` runs it with the old and the new default ``slice_elems``.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch import nn

import geomx
from geomx.zoo.data import digits_split, steps_per_epoch
from geomx.zoo.models import accuracy


def mlp(hidden: int = 1024) -> nn.Module:
    """64 -> hidden -> hidden -> 10 on flattened 8x8 digits; hidden=1024 has a 1M-element weight."""
    return nn.Sequential(nn.Flatten(), nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, 10))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5, help="steps left out of the mean step time")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--hidden", type=int, default=1024)
    args = parser.parse_args()
    if args.steps <= args.warmup:
        raise SystemExit(f"--steps {args.steps} must exceed --warmup {args.warmup}")
    kv = geomx.kv.create("dist_sync")
    torch.manual_seed(0)
    model = mlp(args.hidden)
    params = list(model.parameters())
    if kv.is_master_worker:
        kv.set_optimizer(geomx.optim.SGD(lr=args.lr, momentum=0.9))
    kv.init(list(range(len(params))), [p.data for p in params])
    train, test = digits_split()
    shard = train.shard(kv.global_rank, kv.num_all_workers)
    per_epoch = steps_per_epoch(len(train), kv.num_all_workers, args.batch_size)
    step, epoch, started = 0, 0, 0.0
    while step < args.steps:
        for images, labels in shard.batches(args.batch_size, epoch, per_epoch, seed=kv.global_rank):
            if step == args.warmup:
                started = time.monotonic()
            model.zero_grad()
            F.cross_entropy(model(images), labels).backward()
            for idx, param in enumerate(params):
                kv.push(idx, param.grad, priority=-idx)
            for idx, param in enumerate(params):
                kv.pull(idx, param.data, priority=-idx)
            step += 1
            if step == args.steps:
                break
        epoch += 1
    step_s = (time.monotonic() - started) / (args.steps - args.warmup)
    if kv.is_master_worker:
        kv.record(step=step, step_s=step_s, accuracy=accuracy(model, test.images, test.labels),
                  slice_elems=kv.config.topology.slice_elems)
    kv.close()


if __name__ == "__main__":
    main()
