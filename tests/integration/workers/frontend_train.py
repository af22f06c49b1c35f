"""Integration worker: jobkit's model and data trained by a plain PyTorch loop wrapped in DistributedOptimizer.

The algorithm comes from the topology's ``training`` block / GEOMX_* variables, as for any user. Saves the
weights before and after the wrapper's init and at the end, plus a report (the plan, the overlap counters)
to ``$GEOMX_RUN_DIR/out/worker<global rank>.*``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import threading
import time

import jobkit
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import geomx.torch as gx


class DeepHead(nn.Module):
    """P3's case: a small first layer, parameter-free work in between (so backward takes a while after the
    deepest gradient is out), and a deepest layer (no bias) of 8 x 3 x ``heads`` weights averaged per head."""

    def __init__(self, heads: int) -> None:
        super().__init__()
        self.first = nn.Linear(jobkit.IN_FEATURES, 8)
        mixer = torch.Generator().manual_seed(0)
        self.register_buffer("widen", torch.randn(8, 1024, generator=mixer) / 8 ** 0.5)
        self.register_buffer("mix", torch.randn(1024, 1024, generator=mixer) / 32)
        self.register_buffer("narrow", torch.randn(1024, 8, generator=mixer) / 32)
        self.deepest = nn.Linear(8, jobkit.OUT_FEATURES * heads, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.first(x)) @ self.widen
        for _ in range(12):  # ~0.5 GFLOP of backward between the deepest gradient and the first layer's
            h = torch.tanh(h @ self.mix)
        out = self.deepest(h @ self.narrow)
        return out.reshape(x.shape[0], -1, jobkit.OUT_FEATURES).mean(dim=1)


class ConvHead(nn.Module):
    """Each input as a 4 x 8 image through conv-ReLU-conv-ReLU-MaxPool2d-Linear-ReLU-Linear: the stack whose backward
    torch 2.13's inductor (CPU) compiles wrong when it compiles it whole (zero gradients before the pool)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1), nn.ReLU(),
                                 nn.MaxPool2d(2), nn.Flatten(), nn.Linear(jobkit.IN_FEATURES, 8), nn.ReLU(),
                                 nn.Linear(8, jobkit.OUT_FEATURES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.reshape(-1, 1, 4, jobkit.IN_FEATURES // 4))


class Float32(nn.Module):
    """Casts its input to float32 (before a float32 layer in a model of another dtype)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.float()


def sum_hook(_state, bucket):  # no annotations: DDP accepts only the real types, and this file defers them
    """A script's own DDP comm hook: the party's gradient sum (DDP's default averages)."""
    return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda done: done.value()[0])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=jobkit.STEPS)
    parser.add_argument("--optimizer", choices=["sgd", "adam", "adamw"], default="sgd")
    parser.add_argument("--lr", type=float, default=jobkit.LR)
    parser.add_argument("--momentum", type=float, default=jobkit.MOMENTUM, help="for --optimizer sgd")
    parser.add_argument("--mismatch-rank", type=int, default=-1, help="this global rank builds a wider model")
    parser.add_argument("--hidden", type=int, default=jobkit.HIDDEN)
    parser.add_argument("--deep-head", type=int, default=0,
                        help="instead: a tiny first layer and a deepest layer of 8 x 3 x N weights (P3's case)")
    parser.add_argument("--conv-head", action="store_true", help="instead: a small CNN over 4 x 8 images (ConvHead)")
    parser.add_argument("--batch", type=int, default=jobkit.BATCH, help="the first N examples of each batch")
    parser.add_argument("--party-batch", default="{}", help="JSON: party -> its workers' batch, instead of --batch, "
                        "reported to opt.step(tokens=)")
    parser.add_argument("--step-s", type=float, default=0.0,
                        help="emulated device time per step (a sleep after backward: the model itself is tiny)")
    parser.add_argument("--slow-rank", type=int, default=-1, help="this global rank's device is --slowdown x slower")
    parser.add_argument("--slowdown", type=float, default=1.0)
    parser.add_argument("--die-rank", type=int, default=-1, help="this global rank dies (exit 3) at --die-step")
    parser.add_argument("--die-step", type=int, default=3)
    parser.add_argument("--hang-rank", type=int, default=-1, help="this global rank hangs (alive, never returning) "
                        "at --hang-step, before its forward")
    parser.add_argument("--hang-step", type=int, default=3)
    parser.add_argument("--device", default="cpu", help="cuda: the model and batches on the GPU (NCCL in the party)")
    parser.add_argument("--record", action="store_true", help="save every step's weights before it (held), this "
                        "worker's gradient and the weights after it (received), for a replay of the server's order")
    parser.add_argument("--ddp", action="store_true", help="wrap the model in the script's own DDP over the party's "
                        "group (a collective party's torchrun variables), as a torchrun script does")
    parser.add_argument("--ddp-sums", action="store_true", help="with --ddp: a comm hook of the script's own, the "
                        "party's gradient sum where DDP would average")
    parser.add_argument("--accumulate", type=int, default=1, help="each step's batch in this many micro-batches, "
                        "all but the last backward inside no_sync() (the script's DDP's with --ddp, else the "
                        "wrapper's): gradient accumulation")
    parser.add_argument("--clip", type=float, default=None, help="clip the averaged gradients to this norm between "
                        "backward and step (opt.average_gradients first)")
    parser.add_argument("--dtype", default="float32", help="the model's dtype (bfloat16: a large language model's "
                        "usual weights); the batches are cast to it, the loss is computed in float32")
    parser.add_argument("--join", action="store_true", help="the loop inside opt.join() (uneven loops in a party)")
    parser.add_argument("--short-rank", type=int, default=-1, help="this global rank's loop runs --short-steps only")
    parser.add_argument("--short-steps", type=int, default=0)
    parser.add_argument("--float32-head", action="store_true", help="with --dtype: the last layer stays float32 (a "
                        "model that mixes dtypes), its input cast to it")
    parser.add_argument("--amp", action="store_true", help="mixed precision: the forward under torch.autocast in "
                        "float16, the loss scaled by a torch.amp.GradScaler (opt.average_gradients() before its step)")
    parser.add_argument("--inf-rank", type=int, default=-1, help="with --amp: this global rank's loss is infinite "
                        "at --inf-step (its gradients are not finite: every worker's scaler skips that step)")
    parser.add_argument("--inf-step", type=int, default=2)
    parser.add_argument("--same-seed", action="store_true", help="every worker builds the same model (as a script "
                        "seeded once would): the far parties' INITs carry its digest, not the values")
    parser.add_argument("--compile", default=None, help="torch.compile the model with this backend (inductor, "
                        "aot_eager ...) and wrap the compiled module; the loop calls the compiled one")
    parser.add_argument("--compile-late-rank", type=int, default=-1, help="with --compile: this global rank wraps "
                        "the uncompiled module (the wrapper's hooks then meet the compiler inside the compiled "
                        "forward), the others the compiled one")
    args = parser.parse_args()
    rank, num_workers = gx.worker_place()
    device = torch.device(args.device)
    if device.type == "cuda":  # a GPU of its own, or an NCCL host of its own on a shared one
        from geomx.bench.workers.lan_step import share_gpu

        device = share_gpu()
    # deliberately different per worker (the wrapper's init fixes it), unless --same-seed
    torch.manual_seed(jobkit.seed_for(0 if args.same_seed else rank))
    hidden = args.hidden + (1 if rank == args.mismatch_rank else 0)
    model: nn.Module = nn.Sequential(nn.Linear(jobkit.IN_FEATURES, hidden), nn.ReLU(),
                                     nn.Linear(hidden, jobkit.OUT_FEATURES))
    if args.deep_head:
        model = DeepHead(args.deep_head)
    if args.conv_head:
        model = ConvHead()
    model.to(getattr(torch, args.dtype))
    if args.float32_head:
        model = nn.Sequential(model[0], model[1], Float32(), model[2].float())
    before = [p.detach().clone() for p in model.parameters()]
    model.to(device)
    if args.ddp:  # DDP makes the party's ranks equal at once: rank 0's weights, broadcast
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        model = nn.parallel.DistributedDataParallel(model)
        if args.ddp_sums:
            model.register_comm_hook(None, sum_hook)
    if args.optimizer == "sgd":
        inner: torch.optim.Optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    elif args.optimizer == "adam":
        inner = torch.optim.Adam(model.parameters(), lr=args.lr)
    else:
        inner = torch.optim.AdamW(model.parameters(), lr=args.lr)
    net = torch.compile(model, backend=args.compile) if args.compile else model  # what the loop calls
    compile_late = rank == args.compile_late_rank
    opt = gx.DistributedOptimizer(inner, model if compile_late else net)
    after = [p.detach().to("cpu", copy=True) for p in model.parameters()]
    slices = [opt.kv.slices(key) for key in range(len(after))]  # how each parameter travels (P3: cut small)
    inputs, targets = jobkit.make_data(args.steps, num_workers)
    inputs, targets = inputs[:, :, :args.batch], targets[:, :, :args.batch]
    tokens = json.loads(args.party_batch).get(opt.kv.party)  # this party's batch, reported as the step's tokens
    if tokens is not None:
        inputs, targets = inputs[:, :, :tokens], targets[:, :, :tokens]
    inputs, targets = inputs.to(device, getattr(torch, args.dtype)), targets.to(device)
    device_s = args.step_s * (args.slowdown if rank == args.slow_rank else 1.0)
    pushed = [torch.zeros_like(p) for p in model.parameters()]  # this worker's own gradients, summed over steps
    trained = 0  # steps whose opt.step() changed the weights (under ESync the ones after the last round do not)
    record: dict[str, list[torch.Tensor]] = {"held": [], "local": [], "grad": [], "received": []}  # step-, key-minor
    scaler = torch.amp.GradScaler(device.type, init_scale=2.0 ** 10) if args.amp else None
    scales: list[float] = []  # with --amp: the scale each step's loss was multiplied by
    joined = contextlib.ExitStack()  # with --join, the loop inside opt.join()
    if args.join:
        joined.enter_context(opt.join())
    for step in range(args.short_steps if rank == args.short_rank else args.steps):  # the user's loop, unchanged
        if rank == args.die_rank and step == args.die_step:
            os._exit(3)  # a crash: no goodbye to anyone
        if rank == args.hang_rank and step == args.hang_step:
            threading.Event().wait()  # a hang: alive, its connections open, until the launcher stops it
        opt.zero_grad()
        if args.accumulate > 1:  # DDP's gradient accumulation: the mean loss of the batch, a micro-batch at a time
            parts = list(zip(inputs[step, rank].chunk(args.accumulate), targets[step, rank].chunk(args.accumulate),
                             strict=True))
            with model.no_sync() if args.ddp else opt.no_sync():
                for x, y in parts[:-1]:
                    (F.mse_loss(net(x).float(), y) / len(parts)).backward()
            loss = F.mse_loss(net(parts[-1][0]).float(), parts[-1][1]) / len(parts)
        elif scaler is not None:
            with torch.autocast(device.type, dtype=torch.float16):
                loss = F.mse_loss(net(inputs[step, rank]).float(), targets[step, rank])
            if rank == args.inf_rank and step == args.inf_step:
                loss = loss * float("inf")
            scales.append(scaler.get_scale())
        else:
            loss = F.mse_loss(net(inputs[step, rank]).float(), targets[step, rank])
        (loss if scaler is None else scaler.scale(loss)).backward()
        if device_s:
            time.sleep(device_s)
        for total, p in zip(pushed, model.parameters(), strict=True):
            if p.grad is not None:
                total.add_(p.grad)
        if args.clip is not None:  # the user's clip, on the gradients the step will apply
            opt.average_gradients()
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        before_step = [p.detach().clone() for p in model.parameters()]
        local = [p.grad.detach().to("cpu", copy=True) for p in model.parameters()] if args.record else []
        if scaler is not None:  # the scaler checks and unscales the gradients the step applies
            opt.average_gradients()
            scaler.step(opt)
            scaler.update()
        else:
            opt.step(tokens=tokens)
        if args.record:
            record["held"] += [p.cpu() for p in before_step]
            record["local"] += local  # this worker's own gradient, as backward made it (what it pushes)
            record["grad"] += [p.grad.detach().to("cpu", copy=True) for p in model.parameters()]
            record["received"] += [p.detach().to("cpu", copy=True) for p in model.parameters()]
        trained += any(not torch.equal(p, b) for p, b in zip(model.parameters(), before_step, strict=True))
        opt.log(loss=loss)
    joined.close()  # a rank whose loop ended first takes zero-gradient steps beside the others until all end
    opt.close()  # the last updates land (under ESync: the last round runs here)
    final = [p.detach().to("cpu", copy=True) for p in model.parameters()]
    jobkit.save_worker_output(opt.kv.config.run_dir, rank, {"before_init": before, "after_init": after, "final": final,
                                                       "pushed": [t.cpu() for t in pushed],
                                                       **(record if args.record else {})},
                              {"device": str(next(model.parameters()).device), "name": opt.kv.name,
                               "global_rank": rank, "is_master_worker": opt.is_master_worker, "scales": scales,
                               "mode": opt.plan.mode.name, "overlap": opt.overlap, "names": opt.names,
                               "trained_steps": trained, "compile_late": compile_late,
                               "slices": slices, "ddp_comm_hook": model._get_ddp_logging_data().get("comm_hook", "")
                               if args.ddp else None})


if __name__ == "__main__":
    jobkit.run_and_exit(main)
