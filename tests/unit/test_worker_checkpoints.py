"""A worker's own checkpoints (geomx.torch.checkpoint): its model and optimizer state, verified, matched by step."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from geomx.config import CheckpointSpec, ConfigError
from geomx.runs.checkpoint import CheckpointError
from geomx.torch.checkpoint import WorkerCheckpoints, worker_dir

SETTINGS = {"sync": "dist_sync", "server_optimizer": "auto"}


def trained(steps: int, width: int = 4) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, width), nn.BatchNorm1d(width), nn.Linear(width, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(5, 3)).square().mean().backward()
        optimizer.step()
    return model, optimizer


def test_a_checkpoint_restores_the_model_its_buffers_and_the_optimizer_state(tmp_path: Path) -> None:
    spec = CheckpointSpec(dir=tmp_path, every_steps=2, keep=2)
    mine = WorkerCheckpoints(spec, rank=1, settings=SETTINGS)
    model, optimizer = trained(3)
    assert not mine.maybe_write(3, model, optimizer) and mine.maybe_write(4, model, optimizer)
    for step in (6, 8):
        mine.write(step, model, optimizer)
    assert mine.steps() == [8, 6]  # keep: 2
    assert sorted(p.name for p in worker_dir(tmp_path, 1).iterdir()) == [
        "ckpt-000000006.json", "ckpt-000000006.pt", "ckpt-000000008.json", "ckpt-000000008.pt"]

    fresh, fresh_optimizer = trained(0)
    mine.load(mine.newest(), fresh, fresh_optimizer)
    for name, value in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], value), name  # running statistics too
    saved, loaded = optimizer.state_dict()["state"], fresh_optimizer.state_dict()["state"]
    assert saved.keys() == loaded.keys()
    for index in saved:
        for name in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(saved[index][name], loaded[index][name])


def test_a_corrupt_checkpoint_is_refused_and_the_previous_one_taken(tmp_path: Path) -> None:
    mine = WorkerCheckpoints(CheckpointSpec(dir=tmp_path, every_steps=1), rank=0, settings=SETTINGS)
    model, optimizer = trained(1)
    mine.write(1, model, optimizer)
    mine.write(2, model, optimizer)
    data = worker_dir(tmp_path, 0) / "ckpt-000000002.pt"
    data.write_bytes(data.read_bytes()[:-10] + b"0123456789")
    assert mine.newest() == 1
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        mine.load(2, model, optimizer)
    with pytest.raises(CheckpointError, match=r"ckpt-000000007\.json: missing"):
        mine.load(7, model, optimizer)


def test_another_model_or_other_settings_are_refused_naming_the_difference(tmp_path: Path) -> None:
    spec = CheckpointSpec(dir=tmp_path, every_steps=1)
    model, optimizer = trained(1)
    WorkerCheckpoints(spec, rank=0, settings=SETTINGS).write(1, model, optimizer)
    wider, wider_optimizer = trained(0, width=5)
    with pytest.raises(CheckpointError, match=r"another model: 0.weight is \[5, 3\] here but \[4, 3\]"):
        WorkerCheckpoints(spec, rank=0, settings=SETTINGS).load(1, wider, wider_optimizer)
    other = WorkerCheckpoints(spec, rank=0, settings={**SETTINGS, "sync": "dist_async"})
    with pytest.raises(CheckpointError, match="sync: the checkpoint's 'dist_sync', this job's 'dist_async'"):
        other.load(1, model, optimizer)
    with pytest.raises(CheckpointError, match="no valid checkpoint of this worker"):
        WorkerCheckpoints(spec, rank=3, settings=SETTINGS).newest()


def test_time_cannot_align_the_workers_checkpoints(tmp_path: Path) -> None:
    """By time (alone, or beside every_steps) the global servers would checkpoint steps no worker has."""
    for spec in (CheckpointSpec(dir=tmp_path, every_s=60.0), CheckpointSpec(dir=tmp_path, every_steps=5, every_s=60)):
        with pytest.raises(ConfigError, match=r"every_seconds \(60\) cannot be used.*every_steps alone"):
            WorkerCheckpoints(spec, rank=0, settings=SETTINGS)


def test_the_newest_checkpoint_is_read_once_to_verify_and_load_it(tmp_path: Path, monkeypatch) -> None:
    """A resuming worker verifies its newest checkpoint and loads it: one read of the data file (a large model's
    checkpoint was read twice), and the loop's step it was written at."""
    mine = WorkerCheckpoints(CheckpointSpec(dir=tmp_path, every_steps=2), rank=0, settings=SETTINGS)
    model, optimizer = trained(2)
    mine.write(4, model, optimizer, step=9)  # ESync: checkpoint 4 (global rounds) of the loop's step 9
    reads = []
    load = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: reads.append(a) or load(*a, **k))
    fresh, fresh_optimizer = trained(0)
    assert mine.load(mine.newest(), fresh, fresh_optimizer) == 9
    assert len(reads) == 1
