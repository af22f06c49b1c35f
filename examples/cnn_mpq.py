"""GeoMX's mixed-precision (MPQ) example on real data: tiny tensors fp16 everywhere, large ones fp32 + Bi-Sparse.

The seeds' loop, line by line (GeoMX's Table 1): the master worker turns on Bi-Sparse for the WAN; tensors
with at least ``size_lower_bound`` elements keep fp32 buffers (sparsified between the data centers, dense on
the LAN), smaller ones get fp16 buffers, so they travel as fp16 on the LAN and the WAN. Workers push the
gradient in the buffer's precision, pull the aggregate into it, cast back to fp32 and step locally on the
mean. Servers sum in fp32 (GeoMX sums fp16 in fp16).

    geomx launch topologies/demo.yaml -- python examples/cnn_mpq.py --threshold 0.01
    MXNET_KVSTORE_SIZE_LOWER_BOUND=1000 geomx launch topologies/demo.yaml -- python examples/cnn_mpq.py

The bound comes from the topology's ``size_lower_bound`` (or GEOMX_SIZE_LOWER_BOUND /
MXNET_KVSTORE_SIZE_LOWER_BOUND, default 200000), or ``--size-lower-bound``; the demo CNN's layers are all
below 200000 elements, so its scripts set 1000 (as GeoMX's do). A tensor is large when ``numel >= bound``,
the servers' rule (GeoMX's example script says ``>``). As in ``cnn_bsc.py`` the workers step plain SGD
(lr 0.2) and ask Bi-Sparse for DGC's momentum correction (``momentum`` 0.9; the codec's default is 0,
plain error feedback, for loops that bring their own momentum such as the seeds' Adam).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

import geomx
from geomx.codecs import CodecError, make_codec
from geomx.runs.progress import Progress
from geomx.zoo.data import digits_split, steps_per_epoch
from geomx.zoo.models import DigitsCNN, accuracy


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.2, help="the workers' local SGD learning rate")
    parser.add_argument("--threshold", type=float, default=0.01, help="fraction of a large tensor kept")
    parser.add_argument("--size-lower-bound", type=int, default=None,
                        help="large/tiny split (default: the topology's, i.e. MXNET_KVSTORE_SIZE_LOWER_BOUND)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--channels", type=int, default=16, help="DigitsCNN width: conv channels")
    parser.add_argument("--hidden", type=int, default=64, help="DigitsCNN width: dense hidden units")
    args = parser.parse_args()
    try:  # a bad --threshold or --size-lower-bound in one line now, not as each worker's traceback
        make_codec({"type": "bsc", "threshold": args.threshold, "size_lower_bound": args.size_lower_bound or 0})
    except CodecError as exc:
        parser.exit(2, f"{parser.prog}: error: {exc}\n")  # one line: no usage from every worker
    return args


def main() -> None:
    args = parse_args()
    kv = geomx.kv.create("dist_sync")
    if kv.hfa is not None:  # HFA's servers average models: this loop's gradients would be averaged as weights
        raise SystemExit("cnn_mpq.py pushes gradients every step; the topology's hfa: wants examples/cnn_hfa.py")
    bound = kv.config.topology.size_lower_bound if args.size_lower_bound is None else args.size_lower_bound
    torch.manual_seed(args.seed + 1000 * kv.global_rank)
    model = DigitsCNN(channels=args.channels, hidden=args.hidden)
    params = list(model.parameters())
    if kv.is_master_worker:
        kv.set_gradient_compression({"type": "bsc", "threshold": args.threshold, "size_lower_bound": bound,
                                     "momentum": 0.9})

    def large(tensor: torch.Tensor) -> bool:
        return tensor.numel() >= bound

    # 32-bit server space for large tensors, 16-bit for tiny ones; the master's weights come back through them
    buffers = [p.data if large(p.data) else p.data.half() for p in params]
    kv.init(list(range(len(params))), buffers)
    for param, buffer in zip(params, buffers, strict=True):
        param.data.copy_(buffer.float())
    trainer = torch.optim.SGD(params, lr=args.lr)

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
            # push / pull large tensors in 32 bits, tiny ones in 16 bits
            grads = [p.grad if large(p.grad) else p.grad.half() for p in params]
            for idx, grad in enumerate(grads):
                kv.push(idx, grad, priority=-idx)
            for idx, (param, grad) in enumerate(zip(params, grads, strict=True)):
                kv.pull(idx, grad, priority=-idx)
                param.grad.copy_(grad.float() / kv.num_all_workers)  # back to 32 bits, the mean
            trainer.step()
            losses.append(loss.item())
            total_steps += 1
        acc = accuracy(model, test.images, test.labels)
        progress.epoch(epoch + 1, args.epochs, steps=total_steps, losses=losses, accuracy=acc)
    progress.finish(accuracy=acc, steps=total_steps)
    kv.close()


if __name__ == "__main__":
    main()
