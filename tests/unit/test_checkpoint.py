"""Checkpoint files: round trips, every kind of corruption refused with the file named, pruning, the
background writer, and optimizer state that resumes bit for bit."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from geomx.config import CheckpointSpec, ConfigError
from geomx.optim import DCASGD, SGD, Adam, Optimizer, optimizer_from_spec
from geomx.runs.checkpoint import CheckpointError, CheckpointWriter, Snapshot, load, load_latest, shard_dir, write


def snapshot(step: int) -> Snapshot:
    rng = np.random.default_rng(step)
    return Snapshot(step, {(0, 0): rng.standard_normal(5).astype(np.float32),
                           (1, 1): rng.standard_normal(3).astype(np.float16)}, {(0, 0): step, (1, 1): step + 1})


def test_round_trip(tmp_path: Path) -> None:
    path = write(tmp_path, 0, snapshot(7))
    got = load(path)
    want = snapshot(7)
    assert got.step == 7 and got.rounds == want.rounds and got.source == path
    for sid, value in want.values.items():
        assert got.values[sid].dtype == value.dtype and np.array_equal(got.values[sid], value)
    assert not [p for p in shard_dir(tmp_path, 0).iterdir() if p.name.startswith(".")]


def test_keep_prunes_the_oldest(tmp_path: Path) -> None:
    for step in (2, 4, 6, 8):
        write(tmp_path, 1, snapshot(step), keep=2)
    names = sorted(p.name for p in shard_dir(tmp_path, 1).iterdir())
    assert names == ["ckpt-000000006.json", "ckpt-000000006.npz", "ckpt-000000008.json", "ckpt-000000008.npz"]


@pytest.mark.parametrize("damage, message", [
    ("flip", "checksum mismatch"),
    ("delete_data", "data file ckpt-000000004.npz is missing"),
    ("manifest_garbage", "unreadable manifest"),
    ("manifest_fields", "inconsistent checkpoint"),
    ("format", "format 99"),
])
def test_damaged_newest_is_refused_and_the_previous_used(tmp_path: Path, caplog, damage: str, message: str) -> None:
    write(tmp_path, 0, snapshot(2))
    newest = write(tmp_path, 0, snapshot(4))
    data = newest.with_suffix(".npz")
    if damage == "flip":
        raw = bytearray(data.read_bytes())
        raw[len(raw) // 2] ^= 0x01
        data.write_bytes(bytes(raw))
    elif damage == "delete_data":
        data.unlink()
    elif damage == "manifest_garbage":
        newest.write_text("{not json")
    else:
        manifest = json.loads(newest.read_text())
        if damage == "format":
            manifest["format"] = 99
        else:
            manifest["slices"][0]["array"] = "nope"
        newest.write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match=message) as info:
        load(newest)
    assert "ckpt-000000004" in str(info.value)
    got = load_latest(tmp_path, 0)
    assert got is not None and got.step == 2
    assert any("refused checkpoint" in r.getMessage() and message in r.getMessage() for r in caplog.records)


def test_no_checkpoint_is_none(tmp_path: Path) -> None:
    assert load_latest(tmp_path, 0) is None


def test_writer_writes_when_due_and_the_newest_always_lands(tmp_path: Path) -> None:
    writer = CheckpointWriter(CheckpointSpec(dir=tmp_path, every_steps=2, keep=10), 0, "gs0")
    taken = []

    def take(step: int):
        def build() -> Snapshot:
            taken.append(step)
            return snapshot(step)
        return build

    for step in range(0, 9):
        writer.maybe_write(step, take(step))
    assert writer.wait_idle(10)
    assert taken == [2, 4, 6, 8]
    assert writer.written[-1] == 8  # intermediate ones may be superseded while a write runs, never the last
    assert load_latest(tmp_path, 0).step == 8


def test_checkpoint_spec_needs_a_frequency(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="every_steps"):
        CheckpointSpec(dir=tmp_path)


@pytest.mark.parametrize("make", [lambda: SGD(lr=0.1, momentum=0.9), lambda: Adam(lr=0.01),
                                  lambda: DCASGD(lr=0.1, momentum=0.5)], ids=["sgd", "adam", "dcasgd"])
def test_optimizer_state_resumes_bit_for_bit(tmp_path: Path, make) -> None:
    """Steps 0-2, checkpoint, a fresh optimizer loads the state, steps 3-5 == six uninterrupted steps."""
    rng = np.random.default_rng(0)
    grads = [rng.standard_normal(6).astype(np.float32) for _ in range(6)]
    start = rng.standard_normal(6).astype(np.float32)

    def run(opt: Optimizer, weights: np.ndarray, steps: list[np.ndarray]) -> np.ndarray:
        for grad in steps:
            weights = opt.step((0, 0), weights, grad, contributor="dc1")
        return weights

    straight = run(make(), start, grads)
    first = make()
    middle = run(first, start, grads[:3])
    layout, arrays = first.state()
    write(tmp_path, 0, Snapshot(3, {(0, 0): middle}, {(0, 0): 3}, first.spec(), arrays, layout))
    saved = load_latest(tmp_path, 0)
    assert saved is not None and saved.optimizer_spec == first.spec()
    second = optimizer_from_spec(json.loads(json.dumps(saved.optimizer_spec)))
    second.load_state(saved.optimizer_layout, saved.optimizer_state)
    resumed = run(second, saved.values[(0, 0)], grads[3:])
    assert np.array_equal(resumed, straight)


def test_a_checkpoint_of_an_older_geomx_is_read(tmp_path: Path) -> None:
    """Format 1 named the slice "part", listed "slots" and keyed the optimizer's state by "slot": still read."""
    dcasgd = DCASGD(lr=0.1, momentum=0.5)
    dcasgd.received((1, 1), "dc1", np.zeros(3, np.float32))
    dcasgd.step((1, 1), np.zeros(3, np.float32), np.ones(3, np.float32), contributor="dc1")
    layout, arrays = dcasgd.state()
    want = snapshot(5)
    path = write(tmp_path, 0, Snapshot(5, want.values, want.rounds, dcasgd.spec(), arrays, layout))
    manifest = json.loads(path.read_text())
    manifest["format"] = 1
    manifest["slots"] = [{"key": e["key"], "part": e["slice"], "array": e["array"], "round": e["round"]}
                         for e in manifest.pop("slices")]
    for entries in manifest["optimizer"]["layout"].values():
        for entry in entries:
            entry["slot"] = entry.pop("slice")
    path.write_text(json.dumps(manifest))
    got = load(path)
    assert got.rounds == want.rounds and sorted(got.values) == sorted(want.values)
    assert all(np.array_equal(got.values[sid], value) for sid, value in want.values.items())
    resumed = DCASGD(lr=0.1, momentum=0.5)
    resumed.load_state(got.optimizer_layout, got.optimizer_state)
    assert resumed.state()[0] == layout

def test_load_state_refuses_state_of_another_optimizer() -> None:
    sgd = SGD(lr=0.1, momentum=0.9)
    sgd.step((0, 0), np.zeros(2, np.float32), np.ones(2, np.float32))
    layout, arrays = sgd.state()
    with pytest.raises(ValueError, match="adam has no state '_momentum'"):
        Adam().load_state(layout, arrays)


def test_several_global_servers_resume_from_a_step_every_shard_has(tmp_path: Path) -> None:
    """Shard 1's checkpoint of step 4 was never written (its write was in flight at the crash) and its step 2 is
    corrupt: shard 0 must not go on from its own step 4 (a model of two steps), nor step 2: step 0 it is."""
    for step in (0, 2, 4):
        write(tmp_path, 0, Snapshot(step, {(0, 0): np.full(3, step, np.float32)}))
    for step in (0, 2):
        write(tmp_path, 1, Snapshot(step, {(1, 0): np.full(2, step, np.float32)}))
    data = shard_dir(tmp_path, 1) / "ckpt-000000002.npz"
    data.write_bytes(data.read_bytes()[:-4] + b"oops")
    assert load_latest(tmp_path, 0).step == 4  # alone, its newest
    assert load_latest(tmp_path, 0, shards=2).step == 0
    assert load_latest(tmp_path, 1, shards=2).step == 0
