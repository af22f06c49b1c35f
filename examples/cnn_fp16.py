"""GeoMX's FP16 example on real data: the model computes in fp32, every tensor travels as fp16.

The seeds' loop, line by line: fp16 buffers are initialized on the servers, workers push ``grad.half()``
and pull into the fp16 buffer, then cast back to fp32 and step a local Adam on the mean. Servers sum in
fp32 (GeoMX sums in fp16) and answer in fp16, so LAN and WAN bytes halve.

    geomx launch topologies/demo.yaml -- python examples/cnn_fp16.py
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

import geomx
from geomx.runs.progress import Progress
from geomx.zoo.data import digits_split, steps_per_epoch
from geomx.zoo.models import DigitsCNN, accuracy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.003)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    kv = geomx.kv.create("dist_sync")
    if kv.hfa is not None:  # HFA's servers average models: this loop's gradients would be averaged as weights
        raise SystemExit("cnn_fp16.py pushes gradients every step; the topology's hfa: wants examples/cnn_hfa.py")
    torch.manual_seed(args.seed + 1000 * kv.global_rank)
    model = DigitsCNN()
    params = list(model.parameters())
    # 16-bit buffers on the servers; the master's weights come back through them
    buffers = [p.data.half() for p in params]
    kv.init(list(range(len(params))), buffers)
    for param, buffer in zip(params, buffers, strict=True):
        param.data.copy_(buffer.float())
    trainer = torch.optim.Adam(params, lr=args.lr)

    train, test = digits_split()
    shard = train.shard(kv.global_rank, kv.num_all_workers)
    steps = steps_per_epoch(len(train), kv.num_all_workers, args.batch_size)
    progress, total_steps, acc = Progress(kv), 0, 0.0
    for epoch in range(args.epochs):
        losses = []
        for images, labels in shard.batches(args.batch_size, epoch, steps, seed=args.seed + kv.global_rank):
            trainer.zero_grad()
            loss = F.cross_entropy(model(images), labels)
            loss.backward()
            for idx, param in enumerate(params):
                kv.push(idx, param.grad.half(), priority=-idx)
            for idx, (param, buffer) in enumerate(zip(params, buffers, strict=True)):
                kv.pull(idx, buffer, priority=-idx)
                param.grad.copy_(buffer.float() / kv.num_all_workers)
            trainer.step()
            losses.append(loss.item())
            total_steps += 1
        acc = accuracy(model, test.images, test.labels)
        progress.epoch(epoch + 1, args.epochs, steps=total_steps, losses=losses, accuracy=acc)
    progress.finish(accuracy=acc, steps=total_steps)
    kv.close()


if __name__ == "__main__":
    main()
