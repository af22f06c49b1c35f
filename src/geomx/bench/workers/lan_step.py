"""Bench worker: one party's training step on loopback, under plain DDP over gloo or through geomx's wrapper
(the party's LAN tier, ``lan: server`` or ``lan: collective``, comes from the topology).

Synthetic batches, FSA with the optimizer on every rank (DDP's arithmetic). Rank 0 writes the wall time of every
step (forward, backward, the sync, the optimizer) to ``--out`` as JSON::

    python -m torch.distributed.run --standalone --nproc-per-node 2 -m geomx.bench.workers.lan_step --tier ddp ...
    geomx launch one_party.yaml -- python -m geomx.bench.workers.lan_step --tier geomx --model mlp --out t.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

MODELS = ("mlp", "transformer")


def make_model(name: str) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """The model and one synthetic batch: the digits MLP's shape (64 -> 512 -> 512 -> 10), or a GPT-shaped character
    transformer of ~21M parameters (width 512, 10 blocks, context 64, batch 8)."""
    generator = torch.Generator().manual_seed(0)
    if name == "mlp":
        model: nn.Module = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                                         nn.Linear(512, 10))
        return model, torch.randn(32, 64, generator=generator), torch.randint(0, 10, (32,), generator=generator)
    from geomx.zoo.charlm import VOCAB, CharTransformer

    model = CharTransformer(context=64, dim=512, layers=10, heads=8)
    ids = torch.randint(0, VOCAB, (8, 64), generator=generator)
    return model, ids, torch.roll(ids, -1, dims=1)


def loss_of(name: str, model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    out = model(inputs)
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), targets.reshape(-1))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tier", choices=["ddp", "geomx"], required=True)
    parser.add_argument("--model", choices=MODELS, default="mlp")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--out", required=True, help="rank 0's JSON of step times")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    model, inputs, targets = make_model(args.model)
    inner = torch.optim.SGD(model.parameters(), lr=0.01)
    if args.tier == "ddp":
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
        rank = dist.get_rank()
        wrapped: nn.Module = nn.parallel.DistributedDataParallel(model)
        step_model, opt = wrapped, inner
    else:
        import geomx.torch as gx

        opt = gx.DistributedOptimizer(inner, model)
        rank, step_model = opt.global_rank, model
    times = []
    for _ in range(args.steps):
        started = time.perf_counter()
        opt.zero_grad()
        loss_of(args.model, step_model, inputs, targets).backward()
        opt.step()
        times.append(time.perf_counter() - started)
    params = sum(p.numel() for p in model.parameters())
    if rank == 0:
        Path(args.out).write_text(json.dumps({"step_s": times, "params": params}))
    if args.tier == "ddp":
        dist.barrier()  # then exit: the process group goes with the process
    else:
        opt.close()


if __name__ == "__main__":
    main()
