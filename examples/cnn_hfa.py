"""GeoMX's HFA example on real data: local steps, local model averages, and rare global averages.

Every worker takes K1 local Adam steps, then pushes ``param / num_local_workers`` and pulls: the local
server answers with the party's average model, and every K2-th time with the new global model (parties
weighted by their workers). K1 and K2 come from the topology's ``hfa`` (or MXNET_KVSTORE_HFA_K1/_K2).

    geomx launch topologies/hfa.yaml -- python examples/cnn_hfa.py --epochs 8
    geomx launch topologies/hfa.yaml -- python examples/cnn_hfa.py --outer    # + DiLoCo's outer Nesterov
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

import geomx
from geomx.data import digits_split, steps_per_epoch
from geomx.models import DigitsCNN, accuracy
from geomx.progress import Progress


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.003, help="the workers' local Adam learning rate")
    parser.add_argument("--outer", action="store_true", help="outer Nesterov optimizer on the global server")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--channels", type=int, default=16, help="DigitsCNN width: conv channels")
    parser.add_argument("--hidden", type=int, default=64, help="DigitsCNN width: dense hidden units")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    kv = geomx.kv.create("dist_sync")
    if kv.hfa is None:
        raise SystemExit("HFA is off: add `hfa: {k1: 20, k2: 10}` to the topology or set MXNET_KVSTORE_USE_HFA=1")
    torch.manual_seed(args.seed + 1000 * kv.global_rank)
    model = DigitsCNN(channels=args.channels, hidden=args.hidden)
    params = list(model.parameters())
    if kv.is_master_worker and args.outer:
        kv.set_optimizer(geomx.optim.OuterNesterov())
    kv.init(list(range(len(params))), [p.data for p in params])
    trainer = torch.optim.Adam(params, lr=args.lr)

    train, test = digits_split()
    shard = train.shard(kv.global_rank, kv.num_all_workers)
    steps = steps_per_epoch(len(train), kv.num_all_workers, args.batch_size)
    progress = Progress(kv)
    global_iters = 0
    acc = 0.0
    for epoch in range(args.epochs):
        losses = []
        for images, labels in shard.batches(args.batch_size, epoch, steps, seed=args.seed + kv.global_rank):
            trainer.zero_grad()
            loss = F.cross_entropy(model(images), labels)
            loss.backward()
            trainer.step()
            losses.append(loss.item())
            global_iters += 1
            if global_iters % kv.hfa.k1 == 0:  # a local average (and every K2-th time a global one)
                for idx, param in enumerate(params):
                    kv.push(idx, param.data / kv.num_workers, priority=-idx)
                for idx, param in enumerate(params):
                    kv.pull(idx, param.data, priority=-idx)
        acc = accuracy(model, test.images, test.labels)
        progress.epoch(epoch + 1, args.epochs, steps=global_iters, losses=losses, accuracy=acc)
    progress.finish(accuracy=acc, steps=global_iters)
    kv.close()


if __name__ == "__main__":
    main()
