r"""GeoMX's HFA example on real data: local steps, local model averages, and rare global averages.

Every worker takes K1 local Adam steps, then pushes ``param / num_local_workers`` and pulls: the local
server answers with the party's average model, and every K2-th time with the new global model (parties
weighted by their workers). K1 and K2 come from the topology's ``hfa`` (or MXNET_KVSTORE_HFA_K1/_K2).

The test accuracy is the GLOBAL model's, measured every K1 x K2 local steps on the job's model as the
master worker's local server holds it (``kv.pull_job_model``, no WAN): one line and one record per global
round. Between global rounds each party trains a model of its own, which is not the job's model; under
streaming outer sync (``fragments`` in the training block) no worker ever holds the global model whole.
``--global-rounds N`` trains until N global rounds are done (instead of ``--epochs``); ``--epochs`` stops at its
last whole global round, since local steps after it would reach no global model.

    geomx launch topologies/hfa.yaml -- python examples/cnn_hfa.py --epochs 8
    geomx launch topologies/hfa.yaml -- python examples/cnn_hfa.py --outer    # + DiLoCo's outer Nesterov
    GEOMX_FRAGMENTS=2 GEOMX_FRAGMENT_DELAY=1 GEOMX_FRAGMENT_ALPHA=0.5 \
        geomx launch topologies/hfa.yaml -- python examples/cnn_hfa.py --outer    # streaming
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

import geomx
from geomx.runs.progress import Progress
from geomx.zoo.data import digits_split, steps_per_epoch
from geomx.zoo.models import DigitsCNN, accuracy


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--global-rounds", type=int, default=None,
                        help="train until this many global rounds are done (overrides --epochs)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.003, help="the workers' local Adam learning rate")
    parser.add_argument("--outer", action="store_true", help="outer Nesterov optimizer on the global server")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--channels", type=int, default=16, help="DigitsCNN width: conv channels")
    parser.add_argument("--hidden", type=int, default=64, help="DigitsCNN width: dense hidden units")
    args = parser.parse_args()
    if args.global_rounds is not None and args.global_rounds < 1:  # one line: no usage from every worker
        parser.exit(2, f"{parser.prog}: error: --global-rounds must be at least 1, got {args.global_rounds}\n")
    return args


def main() -> None:
    args = parse_args()
    kv = geomx.kv.create("dist_sync")
    if kv.hfa is None:
        raise SystemExit("HFA is off: add `hfa: {k1: 20, k2: 10}` to the topology or set MXNET_KVSTORE_USE_HFA=1")
    torch.manual_seed(args.seed + 1000 * kv.global_rank)
    model = DigitsCNN(channels=args.channels, hidden=args.hidden)
    params = list(model.parameters())
    job_model = DigitsCNN(channels=args.channels, hidden=args.hidden)  # evaluated: the job's model, not ours
    if kv.is_master_worker and args.outer:
        kv.set_optimizer(geomx.optim.OuterNesterov())
    kv.init(list(range(len(params))), [p.data for p in params])
    trainer = torch.optim.Adam(params, lr=args.lr)

    train, test = digits_split()
    shard = train.shard(kv.global_rank, kv.num_all_workers)
    steps = steps_per_epoch(len(train), kv.num_all_workers, args.batch_size)
    every_global = kv.hfa.k1 * kv.hfa.k2  # local steps between two global averages
    total_rounds = args.global_rounds or (args.epochs * steps) // every_global
    epochs = args.epochs if args.global_rounds is None else -(-args.global_rounds * every_global // steps)
    progress = Progress(kv, unit="global round")
    local_steps, global_rounds, losses = 0, 0, []
    acc = float("nan")
    if total_rounds == 0:
        print(f"note: {epochs * steps} local steps are fewer than one global round ({every_global}): "
              "no global model to evaluate", flush=True)
    for epoch in range(epochs):
        if total_rounds and global_rounds == total_rounds:  # local steps after it would reach no global model
            break
        for images, labels in shard.batches(args.batch_size, epoch, steps, seed=args.seed + kv.global_rank):
            trainer.zero_grad()
            loss = F.cross_entropy(model(images), labels)
            loss.backward()
            trainer.step()
            losses.append(loss.item())
            local_steps += 1
            if local_steps % kv.hfa.k1 == 0:  # a local average (and every K2-th time a global one)
                for idx, param in enumerate(params):
                    kv.push(idx, param.data / kv.num_workers, priority=-idx)
                for idx, param in enumerate(params):
                    kv.pull(idx, param.data, priority=-idx)
            if local_steps % every_global == 0:  # every slice has gone global once more
                global_rounds += 1
                if kv.is_master_worker:  # the same global model in every party: evaluating it once is enough
                    # the job's model as our local server holds it (no WAN): the global model; under streaming
                    # (training.fragments) each fragment's last one, which no worker holds whole
                    kv.pull_job_model(list(range(len(params))), [p.data for p in job_model.parameters()])
                    acc = accuracy(job_model, test.images, test.labels)
                # recorded as ``global_round``: the unit's name
                progress.epoch(global_rounds, total_rounds, steps=local_steps, losses=losses, accuracy=acc,
                               epoch=epoch + 1)
                losses = []
                if global_rounds == total_rounds:
                    break
    progress.finish(accuracy=acc, steps=local_steps)
    kv.close()


if __name__ == "__main__":
    main()
