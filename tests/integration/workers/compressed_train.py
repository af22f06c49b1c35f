"""Integration worker for WAN compression: GeoMX's Bi-Sparse loop on a small MLP.

The master sets the compression; servers only sum (no server optimizer); every worker pushes its gradient,
pulls the aggregate into the gradient, and steps a local SGD on the mean. Saves initial and final weights
and the loss history. The master also reports the global server's byte counters after init and after the
last step (each behind a barrier, so every party's traffic of the training steps is in between): bytes
received by the global server are the parties' pushes, bytes it sent are its answers (the pulls).
"""

from __future__ import annotations

import argparse
import json

import jobkit
import torch
import torch.nn.functional as F
from torch import nn

import geomx


def teacher_data(steps: int, num_workers: int) -> tuple[torch.Tensor, torch.Tensor]:
    """jobkit's inputs with learnable targets: a fixed random linear teacher (so the loss can fall)."""
    inputs, _ = jobkit.make_data(steps, num_workers)
    teacher = torch.randn(jobkit.IN_FEATURES, jobkit.OUT_FEATURES, generator=torch.Generator().manual_seed(7))
    return inputs, inputs @ teacher / jobkit.IN_FEATURES ** 0.5


def reference_sgd(initial: list[torch.Tensor], steps: int, hidden: int, lr: float) -> list[torch.Tensor]:
    """Single-process SGD on the union of the four workers' batches (what dense FSA computes)."""
    model = nn.Sequential(nn.Linear(jobkit.IN_FEATURES, hidden), nn.ReLU(), nn.Linear(hidden, jobkit.OUT_FEATURES))
    with torch.no_grad():
        for p, w in zip(model.parameters(), initial, strict=True):
            p.copy_(w)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    inputs, targets = teacher_data(steps, 4)
    for step in range(steps):
        optimizer.zero_grad()
        F.mse_loss(model(inputs[step].reshape(-1, jobkit.IN_FEATURES)),
                   targets[step].reshape(-1, jobkit.OUT_FEATURES)).backward()
        optimizer.step()
    return [p.detach() for p in model.parameters()]


def global_server_counters(kv: geomx.kv.KVStore) -> dict[str, int] | None:
    """The global server's bytes received and sent (LAN + WAN), behind a barrier; None on non-masters."""
    kv.barrier()
    if not kv.is_master_worker:
        return None
    (body,) = kv.stats()["servers"].values()
    (gs,) = body["upstream"].values()
    return {"recv": gs["lan"]["recv"] + gs["wan"]["recv"], "sent": gs["lan"]["sent"] + gs["wan"]["sent"]}


def bad_compression_requests(kv: geomx.kv.KVStore) -> dict[str, str]:
    """Error texts of compression requests that must fail: bad specs (master), any spec (other workers), and
    a CONFIGURE sent straight to the local server by a worker that is not the master."""
    attempts = {"unknown_type": {"type": "zip"}, "threshold_above_1": {"type": "bsc", "threshold": 1.5},
                "threshold_0": {"type": "mpq", "threshold": 0}} if kv.is_master_worker else {
                "not_master": {"type": "fp16"}}
    errors = {}
    for name, spec in attempts.items():
        try:
            kv.set_gradient_compression(spec)
            errors[name] = "no error"
        except Exception as exc:
            errors[name] = f"{type(exc).__name__}: {exc}"
    if not kv.is_master_worker:
        try:
            kv._configure({"compression": {"type": "fp16"}}, "set the compression")  # bypasses the API's check
            errors["forged_configure"] = "no error"
        except Exception as exc:
            errors["forged_configure"] = f"{type(exc).__name__}: {exc}"
    return errors


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--compression", default="null", help="JSON spec, or null for dense")
    parser.add_argument("--lr", type=float, default=jobkit.LR)
    parser.add_argument("--bad-requests", action="store_true", help="try invalid compression requests first")
    args = parser.parse_args()
    spec = json.loads(args.compression)
    kv = geomx.kv.create("dist_sync")
    rank = kv.global_rank
    torch.manual_seed(jobkit.seed_for(rank))
    model = nn.Sequential(nn.Linear(jobkit.IN_FEATURES, args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, jobkit.OUT_FEATURES))
    params = list(model.parameters())
    errors = bad_compression_requests(kv) if args.bad_requests else {}
    if kv.is_master_worker and spec is not None:
        kv.set_gradient_compression(spec)
    kv.init(list(range(len(params))), [p.data for p in params])
    initial = [p.detach().clone() for p in params]
    before = global_server_counters(kv)
    local = torch.optim.SGD(params, lr=args.lr)
    inputs, targets = teacher_data(args.steps, kv.num_all_workers)
    losses = []
    for step in range(args.steps):
        local.zero_grad()
        loss = F.mse_loss(model(inputs[step, rank]), targets[step, rank])
        loss.backward()
        losses.append(loss.item())
        for idx, param in enumerate(params):
            kv.push(idx, param.grad, priority=-idx)
        for idx, param in enumerate(params):
            kv.pull(idx, param.grad, priority=-idx)
            param.grad /= kv.num_all_workers
        local.step()
    after = global_server_counters(kv)
    jobkit.save_worker_output(kv.config.run_dir, rank, {"initial": initial,
                                                        "final": [p.detach().clone() for p in params]},
                              {"losses": losses, "global_server_bytes": {"before": before, "after": after},
                               "bad_requests": errors})
    kv.close()


if __name__ == "__main__":
    jobkit.run_and_exit(main)
