"""Integration worker: jobkit's model trained by a plain loop in a collective party, sharded by FSDP2 (``--fsdp``:
``fully_shard`` on each layer, then on the root, before the optimizer and the wrapper are built) or not.

The ranks of a party seed alike (FSDP2 shards the one model every rank builds; it broadcasts nothing), each
party differently (the central party's model is the job's: only the wrapper's init makes the others' equal to
it), and every rank trains on its batches of ``jobkit.make_data``, as ``frontend_train.py`` does. Saves the
whole weights after the wrapper's init, at the end, and the job's model (``load_job_model``) (gathered with
``full_tensor`` under FSDP2: the test's doing, not geomx's) to ``$GEOMX_RUN_DIR/out/worker<global rank>.*``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import time
from collections.abc import Iterable

import jobkit
import torch
import torch.distributed as dist
import torch.nn.functional as F

import geomx.torch as gx


def whole(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """Each tensor (a parameter, or its gradient) whole, on the host: gathered over the party under FSDP2 (every
    rank calls it alike)."""
    return [(t.full_tensor() if hasattr(t, "full_tensor") else t).detach().cpu().clone() for t in tensors]


def held_here(model: torch.nn.Module) -> list[torch.Tensor]:
    """What this rank holds of each parameter (its local shard under FSDP2): no collective."""
    return [(p.to_local() if hasattr(p, "to_local") else p).detach().clone() for p in model.parameters()]


def build(fsdp: bool, dtype: torch.dtype = torch.float32, device: torch.device | None = None) -> torch.nn.Module:
    """jobkit's model in ``dtype`` on ``device``, sharded by FSDP2 (each layer, then the root) if ``fsdp``."""
    device = device or torch.device("cpu")
    model = jobkit.make_model().to(device, dtype)
    if fsdp:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        # the mesh of the model's device: fully_shard's default follows torch.cuda.is_available(), so a CPU model
        # on a machine with a GPU would get a CUDA mesh
        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        for layer in (model[0], model[2]):
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    return model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=jobkit.STEPS)
    parser.add_argument("--fsdp", action="store_true", help="shard the model with FSDP2's fully_shard")
    parser.add_argument("--dtype", default="float32", help="the model's dtype; the batches are cast to it")
    parser.add_argument("--step-s", type=float, default=0.0, help="emulated device time per step (a sleep)")
    parser.add_argument("--slow-rank", type=int, default=-1, help="this global rank's device is --slowdown x slower")
    parser.add_argument("--slowdown", type=float, default=1.0)
    parser.add_argument("--record", action="store_true", help="save the sum of the gradients each rank pushed")
    parser.add_argument("--device", default="cpu", help="cuda: the model and batches on the GPU (NCCL in the party)")
    args = parser.parse_args()
    rank, num_workers = gx.worker_place()
    device = torch.device(args.device)
    if device.type == "cuda":
        from geomx.bench.workers.lan_step import share_gpu

        device = share_gpu()
    torch.manual_seed(jobkit.seed_for(rank - int(os.environ["RANK"])))  # the party's first rank's seed
    if args.fsdp:  # torchrun's variables; FSDP2's mesh is on the model's device
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=datetime.timedelta(seconds=60))
    dtype = getattr(torch, args.dtype)
    model = build(args.fsdp, dtype, device)
    opt = gx.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=jobkit.LR), model)
    after = whole(model.parameters())
    inputs, targets = jobkit.make_data(args.steps, num_workers)
    inputs, targets = inputs.to(device, dtype), targets.to(device)
    device_s = args.step_s * (args.slowdown if rank == args.slow_rank else 1.0)
    trained = 0  # steps whose opt.step() changed the weights (under ESync the ones after the last round do not)
    pushed = [torch.zeros_like(p) for p in after]  # (host) the sum of the gradients this rank pushed (--record)
    for step in range(args.steps):
        opt.zero_grad()
        loss = F.mse_loss(model(inputs[step, rank]).float(), targets[step, rank])
        loss.backward()
        if args.record:  # FSDP2's gradients are the party's mean: over a party's ranks they add up to its sum
            for total, grad in zip(pushed, whole(p.grad for p in model.parameters()), strict=True):
                total.add_(grad)
        time.sleep(device_s)
        before = held_here(model)
        opt.step()
        trained += any(not torch.equal(a, b) for a, b in zip(held_here(model), before, strict=True))
    held = build(args.fsdp, dtype, device)  # FSDP2 refuses deepcopy: a model sharded alike, for the job's model
    opt.load_job_model(held)
    opt.close()
    final, job = whole(model.parameters()), whole(held.parameters())
    jobkit.save_worker_output(opt.kv.config.run_dir, rank, {"after_init": after, "final": final, "job": job,
                                                            **({"pushed": pushed} if args.record else {})},
                              {"global_rank": rank, "mode": opt.plan.mode.name, "fsdp": args.fsdp,
                               "trained_steps": trained, "device": str(device)})
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    jobkit.run_and_exit(main)
