"""ESync on real data: every worker runs as many local steps as its speed allows, then all average together.

A state round through the servers assigns local step counts from each worker's measured time per step:
the slowest worker runs K1 steps (the topology's ``hfa.k1``), the others as many as fit in the same time.
Model deltas are averaged every round (HFA with K2 = 1) and scaled by ``--global-lr``; ``--local-lr`` drives
the local steps. ``--slow-rank R --slowdown 3`` makes one worker 3x slower to show the balancing.

    geomx launch topologies/esync.yaml -- python examples/cnn_esync.py --slow-rank 3 --slowdown 3
"""

from __future__ import annotations

import argparse
import itertools
import time

import torch
import torch.nn.functional as F

import geomx
from geomx.runs.progress import Progress
from geomx.zoo.data import digits_split
from geomx.zoo.models import DigitsCNN, accuracy


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--local-lr", type=float, default=0.003)
    parser.add_argument("--global-lr", type=float, default=1.0)
    parser.add_argument("--slow-rank", type=int, default=-1, help="global rank of a worker to slow down")
    parser.add_argument("--slowdown", type=float, default=3.0, help="how many times slower that worker is")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.slowdown < 1:  # one line: no usage from every worker
        parser.exit(2, f"{parser.prog}: error: --slowdown is how many times slower --slow-rank is: at least 1, "
                       f"got {args.slowdown:g}\n")
    return args


def main() -> None:
    args = parse_args()
    kv = geomx.kv.create("dist_sync")
    if kv.hfa is None or kv.hfa.k2 != 1:
        raise SystemExit("ESync runs on HFA with K2 = 1: add `hfa: {k1: 4, k2: 1}` to the topology")
    if not -1 <= args.slow_rank < kv.num_all_workers:  # (-1: none)
        raise SystemExit(f"--slow-rank {args.slow_rank} is no worker's global rank: 0..{kv.num_all_workers - 1}")
    torch.manual_seed(args.seed + 1000 * kv.global_rank)
    model = DigitsCNN()
    params = list(model.parameters())
    if kv.is_master_worker:
        kv.set_optimizer(geomx.optim.SGD(lr=args.global_lr))
    kv.init(list(range(len(params))), [p.data for p in params])
    trainer = torch.optim.Adam(params, lr=args.local_lr)
    train, test = digits_split()
    shard = train.shard(kv.global_rank, kv.num_all_workers)
    batches = itertools.chain.from_iterable(shard.batches(args.batch_size, epoch, seed=args.seed + kv.global_rank)
                                            for epoch in itertools.count())
    steps, total_steps, progress = kv.hfa.k1, 0, Progress(kv, unit="round")
    for round_index in range(1, args.rounds + 1):
        round_started = time.monotonic()
        losses = []
        for _ in range(steps):
            step_started = time.monotonic()
            images, labels = next(batches)
            trainer.zero_grad()
            loss = F.cross_entropy(model(images), labels)
            loss.backward()
            trainer.step()
            losses.append(loss.item())
            if kv.global_rank == args.slow_rank:  # an emulated slower device
                time.sleep((args.slowdown - 1) * (time.monotonic() - step_started))
        total_steps += steps
        per_step = (time.monotonic() - round_started) / steps
        for idx, param in enumerate(params):
            kv.push(idx, param.data / kv.num_workers, priority=-idx)
        for idx, param in enumerate(params):
            kv.pull(idx, param.data, priority=-idx)
        steps = kv.assign_local_steps(per_step, base_steps=kv.hfa.k1)
        if kv.is_master_worker:  # evaluating costs time: only where it is shown
            acc = accuracy(model, test.images, test.labels)
            progress.epoch(round_index, args.rounds, steps=total_steps, losses=losses, accuracy=acc, next_steps=steps,
                           global_round=round_index)  # K2 = 1: every round pulls the global model
    print(f"{kv.name}: {total_steps} local steps in {args.rounds} rounds", flush=True)
    kv.close()


if __name__ == "__main__":
    main()
