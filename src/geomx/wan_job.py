"""The one job every system of ``geomx bench --only wan`` trains: same model, data split, seeds, batch, optimizer.

The digits MLP 64-1024-1024-10 (1.13M parameters, 4.5 MB of fp32 gradients: bandwidth-bound on a WAN),
4 workers (ranks 0-1 in data center A, 2-3 in B), each on its own shard of ``digits_split()``, batch 32,
SGD with momentum 0.9 at a constant learning rate (the same "schedule" everywhere: a server optimizer
cannot follow a per-step schedule), initial weights from seed 0 on every rank.

Each runner writes JSON lines (one per evaluation of the *job's* model: DDP's model, the averaged model
right after an averaging round, geomx's global model after a global round) with :class:`JobLog`::

    log = JobLog(path, rank)
    timer = ComputeTimer()
    with timer("forward"): loss = ...
    log.write(step=12, epoch=1, accuracy=evaluate(model), compute=timer)
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

import torch
import torch.nn.functional as F
from torch import nn

from .data import Dataset, digits_split, steps_per_epoch
from .models import accuracy

HIDDEN = 1024
WORLD = 4
BATCH = 32
LR = 0.05
MOMENTUM = 0.9
SEED = 0
OUTER_LR = 0.7  # DiLoCo's outer Nesterov (torchft and geomx alike)
OUTER_MOMENTUM = 0.9


def make_model(hidden: int = HIDDEN) -> nn.Module:
    """The MLP with seed-0 weights (every rank builds the same initial model)."""
    torch.manual_seed(SEED)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, 10))


def make_optimizer(params: Any, momentum: float = MOMENTUM, lr: float = LR) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=lr, momentum=momentum)


def shard_and_test(rank: int, world: int = WORLD) -> tuple[Dataset, Dataset, int]:
    """This rank's training shard, the test set and the steps per epoch (equal for every rank)."""
    train, test = digits_split()
    return train.shard(rank, world), test, steps_per_epoch(len(train), world, BATCH)


def batches(shard: Dataset, rank: int, epochs: int, steps: int) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
    """(epoch, images, labels) for ``epochs`` epochs of ``steps`` batches, shuffled per rank and epoch."""
    for epoch in range(epochs):
        for images, labels in shard.batches(BATCH, epoch, steps, seed=SEED + rank):
            yield epoch, images, labels


def loss_of(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(images), labels)


class ComputeTimer:
    """Seconds spent in forward, backward and optimizer steps (wall time of each phase on this rank)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {"forward": 0.0, "backward": 0.0, "optimizer": 0.0}

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] += time.perf_counter() - started

    def total(self) -> float:
        return sum(self.seconds.values())


def calibrate_step_s(hidden: int = HIDDEN, steps: int = 8) -> float:
    """Median seconds of one forward + backward + SGD step of this job on this rank, with no communication.

    DDP's backward also waits for its all-reduce, so measured phases include network waits there; this figure
    (times the steps taken) is the compute every system must do, the numerator of compute utilization.
    """
    model = make_model(hidden)
    optimizer = make_optimizer(model.parameters())
    images, labels = torch.rand(BATCH, 1, 8, 8), torch.randint(0, 10, (BATCH,))
    times = []
    for _ in range(steps + 2):
        started = time.perf_counter()
        optimizer.zero_grad()
        loss_of(model, images, labels).backward()
        optimizer.step()
        times.append(time.perf_counter() - started)
    times = sorted(times[2:])
    return times[len(times) // 2]


class JobLog:
    """JSON lines of one rank: ``time`` (s since start, evaluation time excluded), ``step``, ``accuracy`` ..."""

    def __init__(self, path: str | Path, rank: int, system: str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.rank = rank
        self.system = system
        self.started = time.perf_counter()
        self.eval_s = 0.0
        self._file: TextIO = self.path.open("a")

    def elapsed(self) -> float:
        return time.perf_counter() - self.started - self.eval_s

    def evaluate(self, model: nn.Module, test: Dataset) -> float:
        """Test accuracy of ``model``; the seconds it takes are taken off this log's clock."""
        started = time.perf_counter()
        acc = accuracy(model, test.images, test.labels)
        self.eval_s += time.perf_counter() - started
        return acc

    def write(self, *, step: int, epoch: int, accuracy: float | None, compute: ComputeTimer, **extra: Any) -> None:
        record = {"system": self.system, "rank": self.rank, "time": self.elapsed(), "step": step, "epoch": epoch,
                  "accuracy": accuracy, "compute_s": compute.total(), **compute.seconds, **extra}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def read_log(path: str | Path) -> list[dict[str, Any]]:
    """The records of one JobLog file (an unfinished last line, from a run cut at its time cap, is skipped)."""
    records = []
    for line in Path(path).read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records
