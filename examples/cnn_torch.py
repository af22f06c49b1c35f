r"""A plain PyTorch loop on the digits, trained across data centers by changing five lines (marked ``# geomx``).

Which algorithm runs is the topology's business (its ``training`` block and ``hfa`` key, or GEOMX_* variables),
not this file's: by default FSA, every worker pushing its gradients and stepping the wrapped Adam itself on their
mean over all workers (``server_optimizer: auto``, as DDP; ``translate`` moves Adam onto the global servers);
MixedSync + DCASGD, HFA (+ outer Nesterov), ESync, a WAN codec, P3:

    geomx launch topologies/demo.yaml -- python examples/cnn_torch.py
    GEOMX_SYNC=dist_async GEOMX_SERVER_OPTIMIZER=dcasgd:lr=0.05,momentum=0.9 geomx launch topologies/demo.yaml -- \
        python examples/cnn_torch.py
    GEOMX_SERVER_OPTIMIZER=outer_nesterov geomx launch topologies/hfa.yaml -- python examples/cnn_torch.py
    GEOMX_ESYNC=1 geomx launch topologies/esync.yaml -- python examples/cnn_torch.py
    GEOMX_COMPRESSION=fp16 ENABLE_P3=1 geomx launch topologies/demo.yaml -- python examples/cnn_torch.py
"""

from __future__ import annotations

import argparse
import itertools

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import geomx.torch as gx  # geomx
from geomx.zoo.data import digits_split
from geomx.zoo.models import DigitsCNN, accuracy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.003)
    args = parser.parse_args()
    torch.manual_seed(0)
    train, test = digits_split()
    model = DigitsCNN()
    dataset = gx.shard(TensorDataset(train.images, train.labels))  # geomx: this worker's part of the data
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, drop_last=True)
    opt = gx.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=args.lr), model)  # geomx
    # a resumed job (geomx launch --resume) goes on from its checkpoint's step: in the epoch it is in, for the
    # batches that epoch has left (so the job ends at epochs x len(loader) steps, resumed or not)
    first_epoch, done = divmod(opt.start_step, len(loader))
    for epoch in range(first_epoch, args.epochs):
        skip = done if epoch == first_epoch else 0
        batches = itertools.islice(loader, skip, None)
        for images, labels in gx.progress(batches, desc=f"epoch {epoch + 1}", total=len(loader) - skip):
            opt.zero_grad()
            loss = F.cross_entropy(model(images), labels)
            loss.backward()
            opt.step()
            opt.log(loss=loss)  # geomx: the loss in the run's metrics (optional)
        if opt.is_master_worker:
            acc = accuracy(model, test.images, test.labels)
            opt.log(accuracy=acc)
            print(f"epoch {epoch + 1}/{args.epochs}  loss {loss.item():.4f}  test accuracy {acc:.4f}", flush=True)
    opt.close()  # geomx: the last updates land, the worker leaves the job


if __name__ == "__main__":
    main()
