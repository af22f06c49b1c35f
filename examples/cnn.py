"""GeoMX's FSA example on real data: a small CNN on the UCI digits geomx ships, trained across data centers.

The loop is the seeds' loop: forward, backward, push every gradient, pull every parameter; the global
servers run the optimizer. Run it through the launcher:

    geomx launch topologies/demo.yaml -- python examples/cnn.py --epochs 8

``--mixed-sync`` switches to MixedSync (``dist_async``: each party's push is applied on arrival), ``--ssp``
to bounded staleness (``dist_ssp``: a party runs at most ``training.staleness`` global rounds ahead),
``--dcasgd`` installs DCASGD on the global server (SGD with delay compensation: ``--lr`` and ``--momentum`` are
its), ``--dcadam`` DCAdam (Adam with the same compensation: ``--lr`` is its), and ``--slow-party dc1 --slowdown 3``
makes one data center 3x slower to show what MixedSync is for:

    geomx launch topologies/demo.yaml -- python examples/cnn.py --mixed-sync --dcadam

``--channels`` and ``--hidden`` widen the model (``geomx bench``'s bandwidth-bound "wide CNN" is
``--channels 32 --hidden 1536 --batch-size 64``: 1.6M parameters instead of 38k).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

import geomx
from geomx.runs.progress import Progress
from geomx.zoo.data import digits_split, steps_per_epoch
from geomx.zoo.models import DigitsCNN, accuracy


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.003)
    parser.add_argument("--optimizer", choices=["adam", "sgd"], default="adam")
    sync = parser.add_mutually_exclusive_group()
    sync.add_argument("--mixed-sync", action="store_true", help="MixedSync: asynchronous across parties")
    sync.add_argument("--ssp", action="store_true",
                      help="bounded staleness across parties (dist_ssp); the bound is the topology's "
                           "training.staleness (GEOMX_STALENESS)")
    compensated = parser.add_mutually_exclusive_group()
    compensated.add_argument("--dcasgd", action="store_true",
                             help="DCASGD on the global server (with --mixed-sync or --ssp)")
    compensated.add_argument("--dcadam", action="store_true",
                             help="DCAdam on the global server (with --mixed-sync or --ssp)")
    parser.add_argument("--lamda", type=float, default=0.04, help="DCASGD's and DCAdam's variance control")
    parser.add_argument("--slow-party", default=None, help="make this party's workers slower")
    parser.add_argument("--slowdown", type=float, default=3.0, help="how many times slower --slow-party is")
    parser.add_argument("--idle-party", default=None,
                        help="this party's workers join and leave without training (MixedSync: the others train "
                             "alone, the baseline of the fast-party speed in geomx bench)")
    parser.add_argument("--momentum", type=float, default=0.9, help="for --optimizer sgd")
    parser.add_argument("--max-steps", type=int, default=None, help="stop after this many steps in total")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--channels", type=int, default=16, help="DigitsCNN width: conv channels")
    parser.add_argument("--hidden", type=int, default=64, help="DigitsCNN width: dense hidden units")
    args = parser.parse_args()
    problem = None
    if (args.dcasgd or args.dcadam) and not (args.mixed_sync or args.ssp):
        problem = (f"--{'dcasgd' if args.dcasgd else 'dcadam'} needs --mixed-sync or --ssp: under FSA every push "
                   "is computed on the current weights, so there is no delay to compensate")
    elif args.slowdown < 1:
        problem = f"--slowdown is how many times slower --slow-party is: at least 1, got {args.slowdown:g}"
    if problem is not None:  # one line: no usage from every worker
        parser.exit(2, f"{parser.prog}: error: {problem}\n")
    return args


def main() -> None:
    args = parse_args()
    kv = geomx.kv.create("dist_async" if args.mixed_sync else "dist_ssp" if args.ssp else "dist_sync")
    if kv.hfa is not None:  # HFA's servers average models: this loop's gradients would be averaged as weights
        raise SystemExit("cnn.py pushes gradients every step; the topology's hfa: wants examples/cnn_hfa.py")
    if args.idle_party is not None and not args.mixed_sync:
        raise SystemExit("--idle-party needs --mixed-sync: under FSA every step waits for every party")
    parties = [party.name for party in kv.config.topology.parties]
    for flag, party in (("--slow-party", args.slow_party), ("--idle-party", args.idle_party)):
        if party is not None and kv.config.topology.parties_known and party not in parties:
            raise SystemExit(f"{flag} {party!r} is not a party of this job: {parties}")
    if args.idle_party == kv.party and kv.is_master_worker:
        raise SystemExit("--idle-party cannot be the master worker's party (it reports the progress)")
    torch.manual_seed(args.seed + 1000 * kv.global_rank)  # weights differ per process until init syncs them
    model = DigitsCNN(channels=args.channels, hidden=args.hidden)
    params = list(model.parameters())
    if kv.is_master_worker:
        if args.dcasgd:
            optimizer: geomx.optim.Optimizer = geomx.optim.DCASGD(lr=args.lr, momentum=args.momentum,
                                                                  lamda=args.lamda)
        elif args.dcadam:
            optimizer = geomx.optim.DCAdam(lr=args.lr, lamda=args.lamda)
        elif args.optimizer == "adam":
            optimizer = geomx.optim.Adam(lr=args.lr)
        else:
            optimizer = geomx.optim.SGD(lr=args.lr, momentum=args.momentum)
        kv.set_optimizer(optimizer)
    kv.init(list(range(len(params))), [p.data for p in params])  # everyone now holds the master's weights

    train, test = digits_split()
    shard = train.shard(kv.global_rank, kv.num_all_workers)
    steps = steps_per_epoch(len(train), kv.num_all_workers, args.batch_size)
    # MixedSync, SSP: each party holds the global model as of its own last answer, so every party's first
    # worker evaluates and records (geomx bench takes the slowest party's time to target). FSA: one model.
    progress = Progress(kv, every_party=args.mixed_sync or args.ssp)
    total_steps = 0
    acc = 0.0
    epochs = 0 if kv.party == args.idle_party else args.epochs
    for epoch in range(epochs):
        losses = []
        epoch_started = time.monotonic()
        for images, labels in shard.batches(args.batch_size, epoch, steps, seed=args.seed + kv.global_rank):
            compute_started = time.monotonic()
            model.zero_grad()
            loss = F.cross_entropy(model(images), labels)
            loss.backward()
            if kv.party == args.slow_party:  # an emulated slower data center
                time.sleep((args.slowdown - 1) * (time.monotonic() - compute_started))
            for idx, param in enumerate(params):
                kv.push(idx, param.grad, priority=-idx)
            for idx, param in enumerate(params):
                kv.pull(idx, param.data, priority=-idx)
            losses.append(loss.item())
            total_steps += 1
            if args.max_steps is not None and total_steps >= args.max_steps:
                break
        step_time = (time.monotonic() - epoch_started) / max(len(losses), 1)
        acc = accuracy(model, test.images, test.labels)
        # every step pulled the global server's model: global rounds = steps
        progress.epoch(epoch + 1, args.epochs, steps=total_steps, losses=losses, accuracy=acc,
                       step_ms=step_time * 1000, global_round=total_steps)
        if args.max_steps is not None and total_steps >= args.max_steps:
            break
    progress.finish(accuracy=acc, steps=total_steps)
    kv.close()


if __name__ == "__main__":
    main()
