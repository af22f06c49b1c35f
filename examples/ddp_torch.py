r"""A torchrun script with DistributedDataParallel, trained across data centers by changing six lines (marked
``# geomx``). DDP stays inside each data center (a ``lan: collective`` party); geomx syncs the data centers.
Under a ``lan: server`` topology (topologies/demo.yaml) the party's local server does DDP's part, and nothing sets
torchrun's variables: ``gx.init_process_group`` says so in one line (run examples/cnn_torch.py there).

Under HFA / DiLoCo, DDP's all-reduce is every inner step and geomx adds a global round every K1 x K2 steps; under
FSA geomx's reduce-scatter, WAN round and all-gather take the all-reduce's place (docs/collective.md, "The
script's own DDP"):

    geomx launch topologies/collective_streaming.yaml -- python examples/ddp_torch.py   # streaming DiLoCo + int8
    geomx launch topologies/collective.yaml -- python examples/ddp_torch.py             # FSA
    # one data center of a job on several hosts (this one 10.0.1.5), under its own torchrun (docs/collective.md,
    # "Several hosts"): GEOMX_HOST is the address the global servers reach its ranks at
    GEOMX_TOPOLOGY=job.yaml GEOMX_PARTY=dc1 GEOMX_GLOBAL_SCHEDULER=10.0.0.1:9000 GEOMX_HOST=10.0.1.5 \
        GEOMX_RUN_DIR=runs/job torchrun --standalone --nproc-per-node 2 examples/ddp_torch.py
"""

from __future__ import annotations

import argparse
import itertools

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import geomx.torch as gx  # geomx
from geomx.zoo.data import digits_split
from geomx.zoo.models import DigitsCNN, accuracy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    args = parser.parse_args()
    # torchrun's variables (geomx launch sets them in a lan: collective party); on GPUs "nccl" or "cpu:gloo,cuda:nccl"
    gx.init_process_group("gloo")  # geomx: torch's, after checking that the party's ranks are a group
    torch.manual_seed(0)
    train, test = digits_split()
    model = DistributedDataParallel(DigitsCNN())
    rank, num_workers = gx.worker_place()  # geomx: this rank's place among every party's ranks
    sampler = DistributedSampler(TensorDataset(train.images, train.labels), num_replicas=num_workers,
                                 rank=rank, drop_last=True)  # geomx: the job's ranks, not just this party's
    loader = DataLoader(sampler.dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    opt = gx.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.003), model)  # geomx
    # a resumed job (geomx launch --resume) goes on from its checkpoint's step: in the epoch it is in, after the
    # batches done (the sampler's order is the epoch's own: these are the very batches not yet trained)
    first_epoch, done = divmod(opt.start_step, len(loader))
    for epoch in range(first_epoch, args.epochs):
        sampler.set_epoch(epoch)
        for images, labels in itertools.islice(loader, done if epoch == first_epoch else 0, None):
            opt.zero_grad()
            loss = F.cross_entropy(model(images), labels)
            loss.backward()
            opt.step()
            opt.log(loss=loss)
        if opt.is_master_worker:
            acc = accuracy(model.module, test.images, test.labels)
            opt.log(accuracy=acc, epoch=epoch + 1)
            print(f"epoch {epoch + 1}/{args.epochs}  loss {loss.item():.4f}  test accuracy {acc:.4f}", flush=True)
    opt.close()  # geomx: the last updates land, the worker leaves the job
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
