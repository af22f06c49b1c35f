"""Checkpoints of a global server: the global model, the server optimizer's state and the step counter.

Format (no pickle anywhere): ``<dir>/gs<shard>/ckpt-<step>.npz`` holds the arrays (``numpy.savez``, read
back with ``allow_pickle=False``) and ``ckpt-<step>.json`` describes them: format version, step, shard,
wall time, the optimizer's spec and state layout, each slice's round number, and the SHA-256 of the
``.npz``. Both files are written to a temporary name, flushed to disk and renamed, the manifest last, so a
crash mid-write leaves either a complete checkpoint or none. Loading verifies the checksum and every array;
a checkpoint that fails is refused with a log line saying why, and the previous one is used.

``step``: the number of completed rounds of the least advanced (key, slice) that has any, i.e. every slice the
workers push has taken at least that many optimizer steps (``geomx.core.checkpoints``).

Usage::

    writer = CheckpointWriter(spec, shard=0, name="global_server0", settings=plan_settings(topology))
    writer.maybe_write(step, lambda: Snapshot(step, values, rounds, optimizer_spec, optimizer_state))
    snapshot = load_latest(spec.dir, shard=0)          # None if there is no valid checkpoint
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..config import CheckpointSpec
from ..protocol.wire import SliceId

log = logging.getLogger("geomx.runs.checkpoint")

# 3: the manifest says what the values are ("holds") and the job's training settings; 2: it lists "slices", each
# with its "slice" (1: "slots" and "part")
FORMAT_VERSION = 3
READABLE_FORMATS = (1, 2, 3)  # an older geomx's checkpoints are read too (as holding the model, as they were)
MODEL = "model"  # a checkpoint's values are the job's model (an optimizer or a model average ran on the servers)
SUMS = "sums"  # they are the last round's plain sums: the model lives on the workers, who checkpoint it
_NAME = re.compile(r"ckpt-(\d+)\.json")

class CheckpointError(ValueError):
    """A checkpoint that cannot be used (names the file and what is wrong with it)."""


@dataclass
class Snapshot:
    """What a global server needs to go on where it stopped. Arrays are owned copies."""

    step: int
    values: dict[SliceId, np.ndarray]
    rounds: dict[SliceId, int] = field(default_factory=dict)
    optimizer_spec: dict[str, Any] | None = None
    optimizer_state: dict[str, np.ndarray] = field(default_factory=dict)
    optimizer_layout: dict[str, Any] = field(default_factory=dict)
    source: Path | None = None  # the manifest it was loaded from
    holds: str = MODEL  # MODEL or SUMS: whether ``values`` are the job's model
    settings: dict[str, Any] = field(default_factory=dict)  # the job's training settings (``plan_settings``)


def shard_dir(folder: Path, shard: int) -> Path:
    return Path(folder) / f"gs{shard}"


def sha256(path: Path) -> str:
    """The file's SHA-256, hex (what a manifest records of its data file)."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_atomically(path: Path, write: Callable[[Any], None]) -> None:
    """``write(handle)`` to a temporary name beside ``path``, flushed to disk, then renamed onto ``path``."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def write(folder: Path, shard: int, snapshot: Snapshot, keep: int = 3) -> Path:
    """Write ``snapshot`` atomically; keep the newest ``keep`` checkpoints. Returns the manifest's path."""
    target = shard_dir(folder, shard)
    target.mkdir(parents=True, exist_ok=True)
    arrays: dict[str, np.ndarray] = {}
    slices = []
    for index, (sid, value) in enumerate(sorted(snapshot.values.items())):
        arrays[f"slice{index}"] = value
        slices.append({"key": sid[0], "slice": sid[1], "array": f"slice{index}",
                       "round": snapshot.rounds.get(sid, 0), "shape": list(value.shape), "dtype": str(value.dtype)})
    for name, value in snapshot.optimizer_state.items():
        arrays[f"opt/{name}"] = value
    data = target / f"ckpt-{snapshot.step:09d}.npz"
    write_atomically(data, lambda handle: np.savez(handle, **arrays))  # type: ignore[arg-type]
    manifest = {"format": FORMAT_VERSION, "step": snapshot.step, "shard": shard, "time": time.time(),
                "holds": snapshot.holds, "settings": snapshot.settings, "data": data.name, "sha256": sha256(data),
                "slices": slices,
                "optimizer": {"spec": snapshot.optimizer_spec, "layout": snapshot.optimizer_layout,
                              "arrays": sorted(snapshot.optimizer_state)}}
    path = target / f"ckpt-{snapshot.step:09d}.json"
    write_atomically(path, lambda handle: handle.write(json.dumps(manifest, indent=1).encode()))
    with contextlib.suppress(OSError):  # make the renames themselves durable
        fd = os.open(target, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    prune(target, keep, ".npz")
    return path


def manifests(target: Path) -> list[Path]:
    """Manifests in ``target``, newest step first."""
    found = [(int(m.group(1)), p) for p in target.glob("ckpt-*.json") if (m := _NAME.fullmatch(p.name))]
    return [p for _, p in sorted(found, reverse=True)]


def load(manifest_path: Path) -> Snapshot:
    """Read and verify one checkpoint; CheckpointError says what is wrong with it."""
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{manifest_path}: unreadable manifest ({exc})") from None
    try:
        if manifest["format"] not in READABLE_FORMATS:
            raise CheckpointError(f"{manifest_path}: format {manifest['format']} (this geomx reads "
                                  f"{', '.join(map(str, READABLE_FORMATS))})")
        data = checked_data(manifest_path, manifest)
        with np.load(data, allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
        values: dict[SliceId, np.ndarray] = {}
        rounds: dict[SliceId, int] = {}
        old = manifest["format"] == 1  # written before the slice was one word: "slots", "part"
        for entry in manifest["slots" if old else "slices"]:
            sid = (int(entry["key"]), int(entry["part" if old else "slice"]))
            values[sid] = arrays[str(entry["array"])]
            rounds[sid] = int(entry["round"])
        optimizer = manifest["optimizer"]
        state = {name: arrays[f"opt/{name}"] for name in optimizer["arrays"]}
        holds = str(manifest.get("holds", MODEL))
        if holds not in (MODEL, SUMS):
            raise CheckpointError(f"{manifest_path}: holds {holds!r} (this geomx knows {MODEL!r} and {SUMS!r})")
        return Snapshot(int(manifest["step"]), values, rounds, optimizer["spec"], state, optimizer["layout"],
                        manifest_path, holds, dict(manifest.get("settings") or {}))
    except CheckpointError:
        raise
    except (KeyError, TypeError, ValueError, OSError) as exc:  # a manifest or archive that does not add up
        raise CheckpointError(f"{manifest_path}: inconsistent checkpoint ({type(exc).__name__}: {exc})") from None


def load_latest(folder: Path, shard: int, shards: int = 1) -> Snapshot | None:
    """The newest checkpoint of ``shard`` that verifies and whose step every one of ``shards`` global servers has
    checkpointed (a model whose slices were saved at different steps is none); each refused one is logged with the
    reason."""
    for manifest in manifests(shard_dir(folder, shard)):
        step = step_of(manifest)
        missing = [other for other in range(shards) if other != shard
                   and not _verifies(shard_dir(folder, other) / manifest.name)]
        if missing:
            log.error("refused checkpoint: %s: global servers %s have no valid checkpoint of step %d (the shards' "
                      "checkpoints must be of one step); trying the previous one", manifest, missing, step)
            continue
        try:
            return load(manifest)
        except CheckpointError as exc:
            log.error("refused checkpoint: %s; trying the previous one", exc)
    return None


def checked_data(manifest_path: Path, manifest: dict[str, Any]) -> Path:
    """The data file ``manifest`` (read from ``manifest_path``) names, once it is there with the checksum the manifest
    records; CheckpointError says which is not (a global server's ``.npz``, a worker's ``.pt``)."""
    data = manifest_path.with_name(str(manifest["data"]))
    if not data.is_file():
        raise CheckpointError(f"{manifest_path}: its data file {data.name} is missing")
    actual = sha256(data)
    if actual != manifest["sha256"]:
        raise CheckpointError(f"{data}: checksum mismatch (sha256 {actual[:12]}…, the manifest says "
                              f"{str(manifest['sha256'])[:12]}…); the file is corrupt")
    return data


def prune(target: Path, keep: int, data_suffix: str) -> None:
    """Delete all but the newest ``keep`` checkpoints in ``target`` (each manifest with its ``data_suffix`` file)."""
    for old in manifests(target)[keep:]:
        for stale in (old, old.with_suffix(data_suffix)):
            stale.unlink(missing_ok=True)


def _verifies(manifest: Path) -> bool:
    """Whether ``manifest`` exists and its data file has the checksum it records (another shard's, at resume)."""
    try:
        checked_data(manifest, json.loads(manifest.read_text()))
        return True
    except (CheckpointError, OSError, ValueError, KeyError, TypeError):
        return False


def step_of(manifest: Path) -> int:
    """The step a manifest's name says (``ckpt-<step>.json``)."""
    match = _NAME.fullmatch(manifest.name)
    assert match is not None, "manifests() lists only ckpt-<step>.json"
    return int(match.group(1))


class CheckpointWriter:
    """Decides when a global server checkpoints, and writes in the background.

    ``maybe_write(step, take)`` is called after every completed round; ``take`` builds the snapshot (under
    the server's lock, copying the arrays) only when a checkpoint is due. One write runs at a time; a
    snapshot taken meanwhile waits for it (a newer one replaces an older one still waiting), so at most two
    copies of the model exist and the newest due checkpoint is always written.
    """

    def __init__(self, spec: CheckpointSpec, shard: int, name: str, settings: dict[str, Any] | None = None) -> None:
        if spec.dir is None:
            raise ValueError("CheckpointWriter needs checkpoint.dir")
        self.spec = spec
        self.settings = dict(settings or {})  # the job's training settings, recorded in every manifest
        self.folder = spec.dir
        self.shard = shard
        self.name = name
        self.last_step = -1
        self._last_time = time.monotonic()
        self._cond = threading.Condition()
        self._pending: Snapshot | None = None
        self._writing = False
        self.written: list[int] = []

    def due(self, step: int) -> bool:
        if step <= max(self.last_step, 0):
            return False
        every = self.spec.every_steps
        by_steps = every > 0 and step // every > max(self.last_step, 0) // every
        by_time = self.spec.every_s > 0 and time.monotonic() - self._last_time >= self.spec.every_s
        return by_steps or by_time

    def maybe_write(self, step: int, take: Callable[[], Snapshot]) -> bool:
        """Queue a checkpoint of ``step`` if one is due; True if it was queued."""
        if not self.due(step):
            return False
        snapshot = take()
        self.last_step = step
        self._last_time = time.monotonic()
        with self._cond:
            self._pending = snapshot
            if not self._writing:
                self._writing = True
                threading.Thread(target=self._drain, name=f"{self.name}-checkpoint", daemon=True).start()
        return True

    def _drain(self) -> None:
        while True:
            with self._cond:
                snapshot, self._pending = self._pending, None
                if snapshot is None:
                    self._writing = False
                    self._cond.notify_all()
                    return
            try:
                path = write(self.folder, self.shard, snapshot, self.spec.keep)
                self.written.append(snapshot.step)
                log.info("[%s] checkpoint of step %d written to %s", self.name, snapshot.step, path)
            except Exception:  # a full disk must not take the server down: log and keep training
                log.exception("[%s] could not write the checkpoint of step %d", self.name, snapshot.step)

    def wait_idle(self, timeout: float) -> bool:
        """Wait until every queued checkpoint is written (at shutdown); False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._writing, timeout)
