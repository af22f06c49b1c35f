"""Bench worker of the front-end section: a communication-bound CNN, trained by one of two loops.

``--loop sequential`` is the kvstore loop of examples/cnn.py: forward, backward, then push every gradient
and pull every parameter (communication after backward, one after the other). ``--loop wrapper`` is the
same model and server optimizer through ``geomx.torch.DistributedOptimizer`` (pushes from gradient hooks,
forward pre-hooks wait per layer; P3 and priorities as the topology says). Inputs are synthetic: this
measures time. ``--model cnn`` is ``CommBoundCNN`` (its 1M-weight dense layer deepest); ``--model deep`` is
``DeepCNN``, P3's favourable case: six small convolutions first (most of the compute, 47k weights), then
1.3M weights of dense layers last (most of the bytes).

Writes ``$GEOMX_RUN_DIR/out/frontend-<global rank>.json``: mean step, forward, backward and communication
times (ms) over the steps after ``--warmup``, and the process's CPU time per step (``cpu_ms``, all threads:
less sensitive to a busy machine than wall time).

Usage::

    geomx launch bench.yaml -- python -m geomx.bench.workers.frontend --loop wrapper --steps 12
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import geomx
import geomx.torch as gx


class CommBoundCNN(nn.Module):
    """VGG-like: three small convolutions, then a 4096x256 dense layer (1M of its 1.1M parameters) deepest."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(64 * 8 * 8, 256), nn.ReLU(), nn.Linear(256, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class DeepCNN(nn.Module):
    """Six 3x3 convolutions of 32 channels at 32x32 (47k weights, most of the compute), then 2048-512-512-10
    dense layers (1.3M weights, 5.2 MB of gradients): the shallow layers' next forward can overlap the deep
    layers' transfer if their updates arrive first (what P3's priorities are for)."""

    def __init__(self, convs: int = 6, channels: int = 32, hidden: int = 512) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(3, channels, 3, padding=1), nn.ReLU()]
        for _ in range(convs - 1):
            layers += [nn.Conv2d(channels, channels, 3, padding=1), nn.ReLU()]
        self.features = nn.Sequential(*layers, nn.MaxPool2d(4))
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(channels * 8 * 8, hidden), nn.ReLU(),
                                        nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


MODELS: dict[str, type[nn.Module]] = {"cnn": CommBoundCNN, "deep": DeepCNN}


def _mean_ms(values: list[float]) -> float:
    return 1000 * statistics.fmean(values) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--loop", choices=["sequential", "wrapper"], required=True)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--model", choices=sorted(MODELS), default="cnn")
    args = parser.parse_args()
    rank, _ = gx.worker_place()
    torch.manual_seed(rank)
    model = MODELS[args.model]()
    images = torch.randn(args.batch_size, 3, 32, 32)
    labels = torch.randint(0, 10, (args.batch_size,))
    times: dict[str, list[float]] = {"step": [], "cpu": [], "forward": [], "backward": [], "comm": []}
    if args.loop == "wrapper":
        opt = gx.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), model)
        kv = opt.kv
        for step in range(args.steps + args.warmup):
            started, cpu_started = time.monotonic(), time.process_time()
            opt.zero_grad()
            loss = F.cross_entropy(model(images), labels)  # waits, per layer, for the last step's updates
            forward_done = time.monotonic()
            loss.backward()  # pushes each gradient as it is produced
            backward_done = time.monotonic()
            opt.step()
            if step >= args.warmup:
                times["step"].append(time.monotonic() - started)
                times["cpu"].append(time.process_time() - cpu_started)
                times["forward"].append(forward_done - started)
                times["backward"].append(backward_done - forward_done)
        opt.synchronize()
        name, run_dir = kv.name, kv.config.run_dir
        opt.close()
    else:
        kv = geomx.kv.create("dist_sync")
        params = list(model.parameters())
        if kv.is_master_worker:
            kv.set_optimizer(geomx.optim.SGD(lr=0.01))
        kv.init(list(range(len(params))), [p.data for p in params])
        for step in range(args.steps + args.warmup):
            started, cpu_started = time.monotonic(), time.process_time()
            model.zero_grad()
            loss = F.cross_entropy(model(images), labels)
            forward_done = time.monotonic()
            loss.backward()
            backward_done = time.monotonic()
            for idx, param in enumerate(params):
                assert param.grad is not None
                kv.push(idx, param.grad, priority=-idx)
            for idx, param in enumerate(params):
                kv.pull(idx, param.data, priority=-idx)
            done = time.monotonic()
            if step >= args.warmup:
                times["step"].append(done - started)
                times["cpu"].append(time.process_time() - cpu_started)
                times["forward"].append(forward_done - started)
                times["backward"].append(backward_done - forward_done)
                times["comm"].append(done - backward_done)
        name, run_dir = kv.name, kv.config.run_dir
        kv.close()
    if run_dir is not None:
        folder = Path(run_dir) / "out"
        folder.mkdir(parents=True, exist_ok=True)
        result = {"name": name, "loop": args.loop, "model": args.model, "steps": len(times["step"]),
                  **{f"{k}_ms": _mean_ms(v) for k, v in times.items() if v},
                  "step_median_ms": 1000 * statistics.median(times["step"])}
        (folder / f"frontend-{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
