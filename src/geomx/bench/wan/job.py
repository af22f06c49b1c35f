"""The jobs of ``geomx bench --only wan``: every system trains the same model, data split, seeds, batch, optimizer.

A :class:`Job` bundles what a runner needs (model, optimizer, data, loss, the job's evaluation and which way it
improves); ``job("mlp")`` is the digits MLP below, ``job("lm")`` the character transformer of
``lm``. The digits MLP 64-1024-1024-10 (1.13M parameters, 4.5 MB of fp32 gradients: bandwidth-bound on a WAN),
4 workers (ranks 0-1 in data center A, 2-3 in B), each on its own shard of ``digits_split()``, batch 32,
SGD with momentum 0.9 at a constant learning rate (the same "schedule" everywhere: a server optimizer
cannot follow a per-step schedule), initial weights from seed 0 on every rank.

Each runner writes JSON lines (one per evaluation of the *job's* model: DDP's model, the averaged model
right after an averaging round, geomx's global model after a global round) with :class:`JobLog`::

    spec = job("mlp")
    log = JobLog(path, rank, "ddp", spec.metric)
    timer = ComputeTimer()
    with timer("forward"): loss = spec.loss_of(model, x, y)
    log.write(step=12, epoch=1, value=log.evaluate(lambda: spec.evaluate(model, test)), compute=timer)
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import torch
import torch.nn.functional as F
from torch import nn

from ...zoo.data import Dataset, digits_split, steps_per_epoch
from ...zoo.models import accuracy

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
    return calibrate(lambda: make_model(hidden), make_optimizer,
                     lambda: (torch.rand(BATCH, 1, 8, 8), torch.randint(0, 10, (BATCH,))), loss_of, steps)


def calibrate(build: Callable[[], nn.Module], optimizer_for: Callable[[Any], torch.optim.Optimizer],
              batch: Callable[[], tuple[torch.Tensor, torch.Tensor]], loss: Callable[..., torch.Tensor],
              steps: int = 8) -> float:
    """Median seconds of one forward + backward + SGD step of this job on this rank, with no communication.

    DDP's backward also waits for its all-reduce, so measured phases include network waits there; this figure
    (times the steps taken) is the compute every system must do, the numerator of compute utilization.
    """
    model = build()
    optimizer = optimizer_for(model.parameters())
    images, labels = batch()
    times = []
    for _ in range(steps + 2):
        started = time.perf_counter()
        optimizer.zero_grad()
        loss(model, images, labels).backward()
        optimizer.step()
        times.append(time.perf_counter() - started)
    times = sorted(times[2:])
    return times[len(times) // 2]


class JobLog:
    """JSON lines of one rank: ``time`` (s since start, evaluation time excluded), ``step``, ``accuracy`` ..."""

    def __init__(self, path: str | Path, rank: int, system: str, metric: str = "accuracy") -> None:
        self.path = Path(path)
        self.metric = metric
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.rank = rank
        self.system = system
        self.started = time.perf_counter()
        self.eval_s = 0.0
        self._file: TextIO = self.path.open("a")

    def elapsed(self) -> float:
        return time.perf_counter() - self.started - self.eval_s

    def evaluate(self, measure: Callable[[], float]) -> float:
        """``measure()`` (the job's evaluation); the seconds it takes are taken off this log's clock."""
        started = time.perf_counter()
        value = measure()
        self.eval_s += time.perf_counter() - started
        return value

    def write(self, *, step: int, epoch: int, value: float | None, compute: ComputeTimer, **extra: Any) -> None:
        """One record; ``value`` (the job's evaluation) goes under the job's metric name."""
        record = {"system": self.system, "rank": self.rank, "time": self.elapsed(), "step": step, "epoch": epoch,
                  self.metric: value, "compute_s": compute.total(), **compute.seconds, **extra}
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


@dataclass(frozen=True)
class Job:
    """What every runner of the WAN bench needs to train one job the same way (see the module docstring).

    ``metric``: the key of the job's evaluation in the records (``accuracy``: higher is better; ``val_loss``:
    lower is better); ``margin``: how far from DDP-on-loopback's final value the target is set.
    """

    name: str
    title: str  # the table's header line
    metric: str
    higher_is_better: bool
    margin: float
    epochs: int  # of the full run (--quick: the plan's own, MLP only)
    codec_momentum: float  # Bi-Sparse's momentum correction (0 where the local optimizer has its own moments)
    make_model: Callable[[], nn.Module]
    make_optimizer: Callable[[Any, bool], torch.optim.Optimizer]  # (params, residual codec on the WAN)
    shard_and_test: Callable[[int, int], tuple[Dataset, Dataset, int]]
    loss_of: Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]
    evaluate: Callable[[nn.Module, Dataset], float]
    calibrate_step_s: Callable[[], float]

    def reached(self, value: float, target: float) -> bool:
        return value >= target if self.higher_is_better else value <= target

    def target(self, final: float) -> float:
        """DDP-on-loopback's final value, ``margin`` worse: the value every system has to reach."""
        return final - self.margin if self.higher_is_better else final + self.margin


def _mlp_optimizer(params: Any, residual_codec: bool) -> torch.optim.Optimizer:
    # a residual codec's momentum correction is the momentum: the local SGD then has none of its own
    return make_optimizer(params, momentum=0.0 if residual_codec else MOMENTUM)


def _mlp_accuracy(model: nn.Module, test: Dataset) -> float:
    return accuracy(model, test.images, test.labels)


MLP = Job(name="mlp", title="digits MLP 64-1024-1024-10", metric="accuracy", higher_is_better=True, margin=0.01,
          epochs=10, codec_momentum=0.9, make_model=make_model, make_optimizer=_mlp_optimizer,
          shard_and_test=shard_and_test, loss_of=loss_of, evaluate=_mlp_accuracy, calibrate_step_s=calibrate_step_s)
