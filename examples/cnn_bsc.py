r"""GeoMX's Bi-Sparse example on real data: compressed WAN, servers only sum, workers step locally.

The master worker sets the WAN compression; every worker pushes its gradient and pulls the aggregate
*gradient* back (not weights), then a local optimizer steps on the mean. Local servers sparsify their
pushes (top ``--threshold`` of the elements, with error feedback); the global server sparsifies the
aggregate it sends back with its own residual. The LAN stays dense.

With bsc and mpq the workers step plain SGD (lr 0.2) by default and ask the codec for DGC's momentum
correction (``momentum`` 0.9): it *is* the momentum (DGC moves it there so that what waits in the
residual still gets it). ``--optimizer adam`` (the seeds' loop) leaves the codec at its default, plain
error feedback: Adam has its own momentum (benchmarks/README.md, "Bi-Sparse's momentum correction", has the
numbers of both).
At 0.1% use --lr 0.1. ``--model mlp`` trains the issue's port of the seeds' loop (MLP 64-1024-1024-10).

    geomx launch topologies/demo.yaml -- python examples/cnn_bsc.py --threshold 0.01
    geomx launch topologies/demo.yaml -- python examples/cnn_bsc.py --type mpq     # fp16 small, bsc large
    geomx launch topologies/demo.yaml -- python examples/cnn_bsc.py --type fp16
    geomx launch topologies/demo.yaml -- python examples/cnn_bsc.py --model mlp --optimizer frozen_adam \
        --warmup-steps 44 --freeze-after 40     # Adam under Bi-Sparse: the codec's warm-up, the variance frozen

Tensors below MXNET_KVSTORE_SIZE_LOWER_BOUND (default 200000 elements) travel dense: the demo CNN's layers are
all smaller, so this script sends ``--size-lower-bound`` (default 1000, as GeoMX's scripts set) in its codec spec,
where it wins over the variable (docs/compression.md, "The size gate").
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

import geomx
from geomx.codecs import CodecError, make_codec
from geomx.runs.progress import Progress
from geomx.zoo.data import digits_split, steps_per_epoch
from geomx.zoo.models import DigitsCNN, DigitsMLP, accuracy


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=None, help="default: 0.2 with sgd, 0.003 with adam")
    parser.add_argument("--type", choices=["bsc", "mpq", "fp16", "bf16", "int8", "none"], default="bsc",
                        help="the WAN codec; none: dense (FSA without compression)")
    parser.add_argument("--threshold", type=float, default=0.01, help="fraction of elements kept (bsc, mpq)")
    parser.add_argument("--size-lower-bound", type=int, default=1000)
    parser.add_argument("--warmup-steps", type=int, default=0, help="ramp from dense to --threshold (bsc, mpq)")
    parser.add_argument("--momentum", type=float, default=None,
                        help="the codec's DGC momentum correction (bsc, mpq; default 0.9 with sgd, the codec's "
                             "default 0 with adam)")
    parser.add_argument("--optimizer", choices=["adam", "sgd", "frozen_adam"], default=None,
                        help="the workers' local optimizer on the pulled aggregate; default: sgd for bsc and mpq "
                             "(their DGC momentum correction is the momentum), adam otherwise; frozen_adam: Adam "
                             "whose variance freezes after --freeze-after steps (Adam under a sparse codec, with "
                             "--warmup-steps: geomx.torch.FrozenVarianceAdam)")
    parser.add_argument("--freeze-after", type=int, default=10, help="frozen_adam: the steps before the freeze")
    parser.add_argument("--model", choices=["cnn", "mlp"], default="cnn",
                        help="cnn: DigitsCNN; mlp: DigitsMLP 64-1024-1024-10 (the issue's port of the seeds' loop)")
    parser.add_argument("--channels", type=int, default=16, help="DigitsCNN width: conv channels")
    parser.add_argument("--hidden", type=int, default=64, help="DigitsCNN width: dense hidden units")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.optimizer is None:
        args.optimizer = "sgd" if args.type in ("bsc", "mpq") else "adam"
    if args.lr is None:
        args.lr = 0.2 if args.optimizer == "sgd" else 0.003  # adam, frozen_adam
    if args.type != "none":  # a bad --threshold (or the like) in one line now, not as each worker's traceback
        try:
            make_codec(compression_spec(args))
        except CodecError as exc:
            parser.exit(2, f"{parser.prog}: error: {exc}\n")  # one line: no usage from every worker
    return args


def compression_spec(args: argparse.Namespace) -> dict[str, object]:
    if args.type in ("bsc", "mpq"):
        spec: dict[str, object] = {"type": args.type, "threshold": args.threshold,
                                   "size_lower_bound": args.size_lower_bound}
        if args.warmup_steps:
            spec["warmup_steps"] = args.warmup_steps
        momentum = 0.9 if args.momentum is None and args.optimizer == "sgd" else args.momentum
        if momentum is not None:
            spec["momentum"] = momentum
        return spec
    if args.type == "int8":
        return {"type": "error_feedback", "inner": {"type": "int8"}}
    return {"type": args.type}


def make_optimizer(args: argparse.Namespace, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    if args.optimizer == "frozen_adam":
        from geomx.torch import FrozenVarianceAdam

        return FrozenVarianceAdam(params, lr=args.lr, freeze_after=args.freeze_after)
    return torch.optim.Adam(params, lr=args.lr) if args.optimizer == "adam" else torch.optim.SGD(params, lr=args.lr)


def main() -> None:
    args = parse_args()
    kv = geomx.kv.create("dist_sync")
    if kv.hfa is not None:  # HFA's servers average models: this loop's gradients would be averaged as weights
        raise SystemExit("cnn_bsc.py pushes gradients every step; the topology's hfa: wants examples/cnn_hfa.py")
    torch.manual_seed(args.seed + 1000 * kv.global_rank)
    model = DigitsMLP() if args.model == "mlp" else DigitsCNN(channels=args.channels, hidden=args.hidden)
    params = list(model.parameters())
    if kv.is_master_worker and args.type != "none":
        kv.set_gradient_compression(compression_spec(args))
    kv.init(list(range(len(params))), [p.data for p in params])
    kv.barrier()  # every party's init answer has crossed the WAN: count init's share, for per-step figures
    wan_init_mb = kv.wan_bytes() / 1e6 if kv.is_master_worker else 0.0
    trainer = make_optimizer(args, params)

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
                kv.push(idx, param.grad, priority=-idx)
            for idx, param in enumerate(params):
                kv.pull(idx, param.grad, priority=-idx)  # the aggregated gradient
                param.grad /= kv.num_all_workers
            trainer.step()
            losses.append(loss.item())
            total_steps += 1
        acc = accuracy(model, test.images, test.labels)
        if epoch == args.epochs - 1:
            kv.barrier()  # the last step's answers have crossed the WAN: the last record counts all its bytes
        progress.epoch(epoch + 1, args.epochs, steps=total_steps, losses=losses, accuracy=acc, wan_init_mb=wan_init_mb)
    progress.finish(accuracy=acc, steps=total_steps)
    kv.close()


if __name__ == "__main__":
    main()
