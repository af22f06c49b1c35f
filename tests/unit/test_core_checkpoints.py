"""The core's checkpoints against the round table, in one process: step, resume, the optimizer's state."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from geomx.config import CheckpointSpec, plan_settings, topology_from_dict
from geomx.core.checkpoints import MODEL, SUMS, checkpoint_if_due, restore_optimizer, resume, values_of
from geomx.core.rounds import SliceValue
from geomx.core.strategy import STEP_KEY
from geomx.protocol.wire import Kind
from geomx.runs.checkpoint import CheckpointWriter

TWO_PARTIES: dict[str, Any] = {"parties": {"dc0": {"workers": 1}, "dc1": {"workers": 1}}}


def test_a_checkpoint_is_the_least_advanced_slices_step_and_resumes_their_counts(tmp_path: Path,
                                                                               make_server: Any) -> None:
    spec = CheckpointSpec(dir=tmp_path, every_steps=2)
    server = make_server("gs", ["ls0"])
    table = server.table
    stored = {(0, 0): SliceValue(np.ones(3, dtype=np.float32)), (1, 0): SliceValue(np.full(2, 7, dtype=np.float32))}
    table.restore(Kind.PUSHPULL, 0, 0, 5)
    table.restore(Kind.PUSHPULL, 1, 0, 4)
    writer = CheckpointWriter(spec, 0, "gs")
    checkpoint_if_due(writer, stored, table, None)
    assert writer.wait_idle(30)

    fresh = make_server("gs", ["ls0"]).table
    snapshot = resume("gs", spec, 0, fresh)
    assert snapshot is not None and snapshot.step == 4
    assert fresh.completed(Kind.PUSHPULL, 0, 0) == 5 and fresh.completed(Kind.PUSHPULL, 1, 0) == 4
    np.testing.assert_array_equal(values_of(snapshot)[(1, 0)].value, [7, 7])


def test_no_checkpoint_to_resume_from_is_none(tmp_path: Path, make_server: Any) -> None:
    assert resume("gs", CheckpointSpec(), 0, make_server("gs", []).table) is None
    assert resume("gs", CheckpointSpec(dir=tmp_path, every_steps=1), 0, make_server("gs", []).table) is None


class FakeOptimizer:
    def __init__(self, spec: dict[str, Any]) -> None:
        self._spec = spec
        self.loaded: list[Any] = []

    def spec(self) -> dict[str, Any]:
        return self._spec

    def load_state(self, layout: Any, state: Any) -> None:
        self.loaded.append((layout, state))


def test_the_optimizer_state_is_restored_only_into_the_same_optimizer(tmp_path: Path) -> None:
    snapshot: Any = SimpleNamespace(optimizer_spec={"type": "sgd", "lr": 0.1}, optimizer_layout={"m": [0]},
                                    optimizer_state={"m": 1}, source="ckpt", step=3)
    same, other = FakeOptimizer({"type": "sgd", "lr": 0.1}), FakeOptimizer({"type": "adam"})
    restore_optimizer("gs", snapshot, same)  # type: ignore[arg-type]
    restore_optimizer("gs", snapshot, other)  # type: ignore[arg-type]
    assert same.loaded == [({"m": [0]}, {"m": 1})] and other.loaded == []


def test_a_slice_nobody_pushes_is_saved_but_holds_no_step_back(tmp_path: Path, make_server: Any) -> None:
    """The PyTorch wrapper's model signature (a key only INIT-ed) or a frozen parameter never has a round: with
    it counted, its server would never checkpoint."""
    spec = CheckpointSpec(dir=tmp_path, every_steps=2)
    server = make_server("gs", ["ls0"])
    stored = {(0, 0): SliceValue(np.ones(3, dtype=np.float32)), (1 << 30, 0): SliceValue(np.zeros(4, np.float32))}
    server.table.restore(Kind.PUSHPULL, 0, 0, 2)
    writer = CheckpointWriter(spec, 0, "gs")
    checkpoint_if_due(writer, stored, server.table, None)
    assert writer.wait_idle(30)
    snapshot = resume("gs", spec, 0, make_server("gs", ["ls0"]).table)
    assert snapshot is not None and snapshot.step == 2
    np.testing.assert_array_equal(values_of(snapshot)[(1 << 30, 0)].value, np.zeros(4))


def test_under_a_model_average_every_slice_holds_the_step_back(tmp_path: Path, make_server: Any) -> None:
    """Streaming HFA: a fragment not yet global (no round) holds the step back, and a checkpoint is only of a step
    no fragment has passed; the wrapper's keys (never pushed) hold nothing back."""
    spec = CheckpointSpec(dir=tmp_path, every_steps=1)
    server = make_server("gs", ["ls0"])
    table = server.table
    stored = {(0, 0): SliceValue(np.ones(3, dtype=np.float32)), (1, 0): SliceValue(np.ones(2, dtype=np.float32)),
              (STEP_KEY, 0): SliceValue(np.zeros(1))}
    writer = CheckpointWriter(spec, 0, "gs")
    table.restore(Kind.PUSHPULL, 0, 0, 1)  # fragment 0 went global; fragment 1 not yet
    checkpoint_if_due(writer, stored, table, None, MODEL, every_slice=True)
    assert writer.last_step < 0  # none queued
    table.restore(Kind.PUSHPULL, 1, 0, 1)
    table.restore(Kind.PUSHPULL, 0, 0, 2)  # fragment 0 a cycle further: its values are of another step
    checkpoint_if_due(writer, stored, table, None, MODEL, every_slice=True)
    assert writer.last_step < 0  # none queued
    table.restore(Kind.PUSHPULL, 1, 0, 2)
    checkpoint_if_due(writer, stored, table, None, MODEL, every_slice=True)
    assert writer.wait_idle(30) and writer.written == [2]


def _written(tmp_path: Path, make_server: Any, holds: str, settings: dict[str, Any]) -> CheckpointSpec:
    """A checkpoint of step 2 holding ``holds``, written under ``settings``, with the wrapper's step key."""
    spec = CheckpointSpec(dir=tmp_path, every_steps=2)
    table = make_server("gs", ["ls0"]).table
    table.restore(Kind.PUSHPULL, 0, 0, 2)
    stored = {(0, 0): SliceValue(np.ones(3, dtype=np.float32)), (STEP_KEY, 0): SliceValue(np.zeros(1))}
    writer = CheckpointWriter(spec, 0, "gs", settings)
    checkpoint_if_due(writer, stored, table, None, holds)
    assert writer.wait_idle(30)
    return spec


def test_a_checkpoint_of_sums_is_never_handed_out_as_the_model(tmp_path: Path, make_server: Any) -> None:
    settings = plan_settings(topology_from_dict(TWO_PARTIES))
    spec = _written(tmp_path, make_server, SUMS, settings)
    snapshot = resume("gs", spec, 0, make_server("gs", ["ls0"]).table, settings)
    assert snapshot is not None and snapshot.holds == SUMS and snapshot.settings == settings
    assert values_of(snapshot) == {}  # the master worker's INIT (its own checkpoint's model) is taken instead


def test_a_checkpoint_of_the_model_hands_out_its_step_under_the_step_key(tmp_path: Path, make_server: Any) -> None:
    spec = _written(tmp_path, make_server, MODEL, {})
    snapshot = resume("gs", spec, 0, make_server("gs", ["ls0"]).table)
    assert snapshot is not None
    values = values_of(snapshot)
    np.testing.assert_array_equal(values[(0, 0)].value, [1, 1, 1])
    np.testing.assert_array_equal(values[(STEP_KEY, 0)].value, [2])


def test_resuming_under_other_training_settings_is_refused_naming_them(tmp_path: Path, make_server: Any,
                                                                      caplog: Any) -> None:
    written = plan_settings(topology_from_dict(TWO_PARTIES))
    spec = _written(tmp_path, make_server, MODEL, written)
    other = plan_settings(topology_from_dict({**TWO_PARTIES, "training": {"sync": "dist_async",
                                                                      "server_optimizer": "translate"}}))
    assert resume("gs", spec, 0, make_server("gs", ["ls0"]).table, other) is None
    assert "sync: the checkpoint's 'dist_sync', this job's 'dist_async'" in caplog.text
    assert "server_optimizer: the checkpoint's 'auto', this job's 'translate'" in caplog.text
