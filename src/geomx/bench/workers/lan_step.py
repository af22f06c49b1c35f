"""Bench worker: one party's training step on loopback, under plain DDP over gloo or through geomx's wrapper
(the party's LAN tier, ``lan: server`` or ``lan: collective``, comes from the topology).

Synthetic batches, FSA with the optimizer on every rank (DDP's arithmetic). Rank 0 writes the wall time of every
step (forward, backward, the sync, the optimizer; on a GPU up to the device's end of it) and the CPU time its
process used in it (all threads) to ``--out`` as JSON.
``plain`` is the same loop with no sync at all (the ranks train side by side): the compute a tier adds to.

With ``--device cuda`` the model and batches live on the GPU and DDP runs over NCCL. Ranks that outnumber the GPUs
share them: each names an NCCL host of its own (``NCCL_HOSTID``), as torchft does, or NCCL refuses the duplicate
GPU::

    python -m torch.distributed.run --standalone --nproc-per-node 2 -m geomx.bench.workers.lan_step --tier ddp ...
    geomx launch one_party.yaml -- python -m geomx.bench.workers.lan_step --tier geomx --model mlp --out t.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from geomx.bench.workers.teardown import leave_process_group
from geomx.zoo.charlm import PRESETS, VOCAB, Shape, build

# the GPT-shaped character transformers and their batch; gpt57m and gpt85m are the zoo's presets (57.1M: issue 22's
# GPU run, 12 blocks, ff 2x; 85.4M: GPT-2 small's 12 blocks, ff 4x; issue 22's 85.5M figures were 18 blocks, ff 2x)
TRANSFORMERS: dict[str, tuple[Shape, int]] = {
    "transformer": (Shape(dim=512, layers=10, heads=8, context=64), 8),  # ~21M parameters, for the CPU
    "gpt57m": (PRESETS["gpt57m"], 16),
    "gpt85m": (PRESETS["gpt85m"], 16)}
MODELS = ("mlp", *TRANSFORMERS)


def make_model(name: str) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """The model and one synthetic batch: the digits MLP's shape (64 -> 512 -> 512 -> 10), or a GPT-shaped character
    transformer of ``TRANSFORMERS``."""
    generator = torch.Generator().manual_seed(0)
    if name == "mlp":
        model: nn.Module = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                                         nn.Linear(512, 10))
        return model, torch.randn(32, 64, generator=generator), torch.randint(0, 10, (32,), generator=generator)
    shape, batch = TRANSFORMERS[name]
    model = build(shape)
    ids = torch.randint(0, VOCAB, (batch, shape.context), generator=generator)
    return model, ids, torch.roll(ids, -1, dims=1)


def share_gpu() -> torch.device:
    """This rank's GPU (``LOCAL_RANK`` modulo the GPUs); where ranks outnumber GPUs, an NCCL host of its own."""
    if torch.cuda.device_count() < int(os.environ.get("LOCAL_WORLD_SIZE", "1")):
        os.environ.setdefault("NCCL_HOSTID", f"geomx-bench-rank{os.environ.get('RANK', '0')}")
    index = int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def loss_of(name: str, model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    out = model(inputs)
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), targets.reshape(-1))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tier", choices=["plain", "ddp", "geomx"], required=True)
    parser.add_argument("--model", choices=MODELS, default="mlp")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--optimizer", choices=["sgd", "adamw"], default="sgd")
    parser.add_argument("--out", required=True, help="rank 0's JSON of step times")
    parser.add_argument("--ddp", action="store_true", help="--tier geomx: the script wraps its model in DDP itself "
                        "(a collective party's group, from the launcher's torchrun variables)")
    args = parser.parse_args(argv)
    device = share_gpu() if args.device == "cuda" else torch.device("cpu")
    if device.type == "cpu":
        torch.set_num_threads(1)
    model, inputs, targets = make_model(args.model)
    model.to(device)
    inputs, targets = inputs.to(device), targets.to(device)
    inner = (torch.optim.SGD(model.parameters(), lr=0.01) if args.optimizer == "sgd"
             else torch.optim.AdamW(model.parameters(), lr=1e-4))
    step_model: nn.Module = model
    opt: torch.optim.Optimizer = inner
    if args.tier == "ddp":
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=datetime.timedelta(seconds=300))
        step_model = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.index is not None
                                                         else None)
    elif args.tier == "geomx":
        import geomx.torch as gx

        if args.ddp:  # the script's own DDP, as a torchrun script keeps it (geomx.collective.ddp)
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
            step_model = nn.parallel.DistributedDataParallel(model, device_ids=[device.index]
                                                             if device.index is not None else None)
        opt = gx.DistributedOptimizer(inner, step_model)
    rank = int(os.environ.get("RANK", "0")) if args.tier != "geomx" else opt.global_rank  # type: ignore[attr-defined]
    times, cpu = [], []
    for _ in range(args.steps):
        started, used = time.perf_counter(), time.process_time()
        opt.zero_grad()
        loss_of(args.model, step_model, inputs, targets).backward()
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
        cpu.append(time.process_time() - used)  # every thread of the rank: gloo's, the sockets', the wrapper's
    params = sum(p.numel() for p in model.parameters())
    if rank == 0:
        Path(args.out).write_text(json.dumps({"step_s": times, "cpu_s": cpu, "params": params, "device": str(device),
                                              "device_name": torch.cuda.get_device_name(device)
                                              if device.type == "cuda" else "cpu"}))
    if args.tier == "geomx":
        opt.close()  # type: ignore[attr-defined]
    if args.tier == "ddp" or args.ddp:
        leave_process_group(device)


if __name__ == "__main__":
    main()
