"""A top-tier server's checkpoints: resume from the newest valid one, write one when due, restore the optimizer.

The files themselves are ``geomx.runs.checkpoint``'s (npz + a JSON manifest); this module ties them to the round
table: a checkpoint's step is the completed rounds of the least advanced slice, and a resumed server's rounds
go on counting from the checkpoint's.

Usage (inside a global server)::

    snapshot = resume(name, spec, shard, table)            # --resume; None (logged) if there is none
    checkpoint_if_due(writer, stored, table, optimizer)      # after every applied round
"""

from __future__ import annotations

import logging

import numpy as np

from ..config import CheckpointSpec
from ..optim import Optimizer
from ..protocol.wire import Kind, SliceId
from ..runs.checkpoint import CheckpointWriter, Snapshot, load_latest, shard_dir
from .rounds import RoundTable, SliceValue

log = logging.getLogger("geomx.server")


def resume(name: str, spec: CheckpointSpec, shard: int, table: RoundTable) -> Snapshot | None:
    """The newest valid checkpoint of ``shard`` (its round counts restored into ``table``); None, logged, if
    there is none."""
    if spec.dir is None:
        log.error("[%s] --resume needs a checkpoint folder: set checkpoint.dir in the topology "
                  "(or GEOMX_CHECKPOINT_DIR)", name)
        return None
    snapshot = load_latest(spec.dir, shard)
    if snapshot is None:
        log.error("[%s] --resume: no valid checkpoint in %s", name, shard_dir(spec.dir, shard))
        return None
    for (key, index), number in snapshot.rounds.items():
        table.restore(Kind.PUSHPULL, key, index, number)
    log.info("[%s] resumed from %s: step %d, %d slices", name, snapshot.source, snapshot.step, len(snapshot.values))
    return snapshot


def values_of(snapshot: Snapshot) -> dict[SliceId, SliceValue]:
    return {sid: SliceValue(value) for sid, value in snapshot.values.items()}


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
                      optimizer: Optimizer | None) -> None:
    """Checkpoint when due; the step is the completed rounds of the least advanced slice that the workers push (a
    slice without a round, such as the PyTorch wrapper's model signature or a frozen parameter, is saved but
    holds no step back: with it, its server would never checkpoint)."""
    if writer is None or not stored:
        return
    rounds = {sid: table.completed(Kind.PUSHPULL, *sid) for sid in stored}
    step = min((count for count in rounds.values() if count), default=0)

    def take() -> Snapshot:
        layout, state = optimizer.state() if optimizer is not None else ({}, {})
        return Snapshot(step, {sid: np.array(kept.value, copy=True) for sid, kept in stored.items()},
                        rounds, optimizer.spec() if optimizer is not None else None, state, layout)

    writer.maybe_write(step, take)
