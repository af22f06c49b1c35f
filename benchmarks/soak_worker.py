"""Worker of the soak benchmark (benchmarks/soak.py): the digits CNN under MixedSync until a wall-clock deadline.

Every worker pushes its gradient and pulls the global weights each step (the global server runs Adam); a
metrics record every ``--record-every`` steps (step, loss) and a test accuracy every 10 records. A worker of a
restarted party starts from the current global model (``kv.init``) and trains to the same deadline.

Usage (inside a job)::

    python benchmarks/soak_worker.py --until 1767000000.0
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

import geomx
from geomx.zoo.data import digits_split, steps_per_epoch
from geomx.zoo.models import DigitsCNN, accuracy


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--until", type=float, required=True, help="time.time() at which to stop")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.001)
    parser.add_argument("--record-every", type=int, default=20)
    args = parser.parse_args()
    kv = geomx.kv.create("dist_async")
    rank = kv.global_rank
    torch.manual_seed(rank)
    model = DigitsCNN()
    params = list(model.parameters())
    if kv.is_master_worker:
        kv.set_optimizer(geomx.optim.Adam(lr=args.lr))
    kv.init(list(range(len(params))), [p.data for p in params])
    train, test = digits_split()
    shard = train.shard(rank, kv.num_all_workers)
    steps = steps_per_epoch(len(train), kv.num_all_workers, args.batch_size)
    step, epoch, losses = 0, 0, []
    while time.time() < args.until:
        for images, labels in shard.batches(args.batch_size, epoch, steps, seed=rank):
            if time.time() >= args.until:
                break
            model.zero_grad()
            loss = F.cross_entropy(model(images), labels)
            loss.backward()
            for idx, param in enumerate(params):
                kv.push(idx, param.grad, priority=-idx)
            for idx, param in enumerate(params):
                kv.pull(idx, param.data, priority=-idx)
            step += 1
            losses.append(loss.item())
            if step % args.record_every == 0:
                record = {"step": step, "loss": sum(losses) / len(losses)}
                if step % (10 * args.record_every) == 0:
                    record["test_accuracy"] = accuracy(model, test.images, test.labels)
                kv.record(**record)
                losses = []
        epoch += 1
    kv.record(step=step, test_accuracy=accuracy(model, test.images, test.labels))
    kv.close()


if __name__ == "__main__":
    main()
