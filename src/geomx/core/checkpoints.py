"""A top-tier server's checkpoints: resume from the newest valid one, write one when due, restore the optimizer.

The files themselves are ``geomx.runs.checkpoint``'s (npz + a JSON manifest); this module ties them to the round
table: a checkpoint's step is the completed rounds of the least advanced slice, and a resumed server's rounds
go on counting from the checkpoint's.

What a checkpoint's values are depends on the plan: the job's model where an optimizer or a model average runs on
the global servers (``MODEL``), the last round's plain sums where the workers' own optimizer steps on them
(``SUMS``: the wrapper's default under FSA; the workers checkpoint the model, ``geomx.torch.checkpoint``). A
resumed server hands a ``MODEL`` checkpoint's values out at INIT, with the step it holds under ``STEP_KEY``; a
``SUMS`` checkpoint's values are never handed out as a model: the master worker's INIT (its own checkpoint's
model and step) is taken as on a fresh start.

Usage (inside a global server)::

    snapshot = resume(name, spec, shard, table, plan_settings(topology))  # --resume; None (logged) if none
    checkpoint_if_due(writer, stored, table, optimizer, holds)              # after every applied round
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from ..config import CheckpointSpec, settings_difference
from ..optim import Optimizer
from ..protocol.wire import Kind, SliceId
from ..runs.checkpoint import MODEL, SUMS, CheckpointWriter, Snapshot, load_latest, shard_dir
from .rounds import RoundTable, SliceValue
from .strategy import STEP_KEY, WRAPPER_KEYS

__all__ = ["MODEL", "SUMS", "checkpoint_if_due", "restore_optimizer", "resume", "values_of"]

log = logging.getLogger("geomx.server")


def resume(name: str, spec: CheckpointSpec, shard: int, table: RoundTable,
           settings: dict[str, Any] | None = None, shards: int = 1) -> Snapshot | None:
    """The newest valid checkpoint of ``shard`` that all ``shards`` global servers have (its round counts restored
    into ``table``); None, logged, if there is none or it was written under other training ``settings`` (each
    difference named)."""
    if spec.dir is None:
        log.error("[%s] --resume needs a checkpoint folder: set checkpoint.dir in the topology "
                  "(or GEOMX_CHECKPOINT_DIR)", name)
        return None
    snapshot = load_latest(spec.dir, shard, shards)  # the newest step every shard has
    if snapshot is None:
        log.error("[%s] --resume: no valid checkpoint in %s", name, shard_dir(spec.dir, shard))
        return None
    difference = settings_difference(snapshot.settings, settings) if settings is not None else None
    if difference is not None:
        log.error("[%s] --resume: %s was written by a job with other training settings (%s): resume with the "
                  "settings it was written with, or start afresh without --resume", name, snapshot.source, difference)
        return None
    for (key, index), number in snapshot.rounds.items():
        table.restore(Kind.PUSHPULL, key, index, number)
    log.info("[%s] resumed from %s: step %d, %d slices", name, snapshot.source, snapshot.step, len(snapshot.values))
    if snapshot.holds == SUMS:
        log.info("[%s] the checkpoint of step %d holds the last gradient sums, not the model (the optimizer ran on "
                 "the workers): the model and the step come from the master worker's own checkpoint", name,
                 snapshot.step)
    return snapshot


def values_of(snapshot: Snapshot) -> dict[SliceId, SliceValue]:
    """What a resumed server holds at start: a ``MODEL`` checkpoint's values, with its step under ``STEP_KEY``;
    nothing from a ``SUMS`` checkpoint (its values are no model: the master worker's INIT is taken instead)."""
    if snapshot.holds == SUMS:
        return {}
    values = {sid: SliceValue(value) for sid, value in snapshot.values.items()}
    step = values.get((STEP_KEY, 0))
    if step is not None:  # the wrapper's step, as of the checkpoint (written at INIT, never pushed)
        step.value = np.full_like(step.value, snapshot.step)
    return values


def restore_optimizer(name: str, snapshot: Snapshot | None, optimizer: Optimizer | None) -> None:
    """After a resume, give the newly configured optimizer the checkpoint's state if it is the same one."""
    if snapshot is None or optimizer is None or snapshot.optimizer_spec is None:
        return
    if snapshot.optimizer_spec != optimizer.spec():
        log.warning("[%s] the checkpoint's optimizer %s differs from the configured %s: its state is not "
                    "restored", name, snapshot.optimizer_spec, optimizer.spec())
        return
    try:
        optimizer.load_state(snapshot.optimizer_layout, snapshot.optimizer_state)
    except (KeyError, TypeError, ValueError) as exc:
        log.error("[%s] cannot restore the optimizer state of %s: %s", name, snapshot.source, exc)
        return
    log.info("[%s] optimizer state restored from step %d", name, snapshot.step)


def checkpoint_if_due(writer: CheckpointWriter | None, stored: dict[SliceId, SliceValue], table: RoundTable,
                      optimizer: Optimizer | None, holds: str = MODEL, every_slice: bool = False) -> None:
    """Checkpoint when due; the step is the completed rounds of the least advanced slice that the workers push (a
    slice without a round, such as the PyTorch wrapper's model signature or a frozen parameter under FSA, is saved
    but holds no step back: with it, its server would never checkpoint). ``every_slice``: every model slice has
    rounds (a model average pushes frozen parameters too), so one without any holds the step back as well (a slice
    whose turn to go global has not come yet; the wrapper's keys aside), and a checkpoint is only of a step every
    slice has reached and none has passed (a slice already a round further would make it of two steps)."""
    if writer is None or not stored:
        return
    rounds = {sid: table.completed(Kind.PUSHPULL, *sid) for sid in stored}
    counted = [count for sid, count in rounds.items() if count or (every_slice and sid[0] < WRAPPER_KEYS)]
    step = min(counted, default=0)
    if every_slice and counted and max(counted) != step:
        return

    def take() -> Snapshot:
        layout, state = optimizer.state() if optimizer is not None else ({}, {})
        return Snapshot(step, {sid: np.array(kept.value, copy=True) for sid, kept in stored.items()},
                        rounds, optimizer.spec() if optimizer is not None else None, state, layout,
                        holds=holds, settings=writer.settings)

    writer.maybe_write(step, take)
