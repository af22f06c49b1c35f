"""A worker's own checkpoints: its model and its torch optimizer's state, where the plan keeps them on the workers.

Under the wrapper's default FSA plan (``Strategy.LOCAL``) the wrapped torch optimizer steps on every worker on
the averaged gradient, as under DDP: the global servers hold only the last round's gradient sums, so the job's
model and the optimizer's state (Adam's moments, say) exist on the workers alone. Each worker then writes its
part, every ``checkpoint.every_steps`` of its own steps, before its next push: ``<dir>/workers/worker<rank>/
ckpt-<step>.pt`` (``model.state_dict()`` and ``optimizer.state_dict()``, read back with ``weights_only=True``)
and ``ckpt-<step>.json`` (format, step, the data file's SHA-256, the model's names and shapes, the training
settings), written as the global servers write theirs (``geomx.runs.checkpoint``: temporary name, fsync,
rename, manifest last; the newest ``keep`` kept).

On ``--resume`` the master worker loads its newest valid checkpoint, so the model it INITs is the checkpoint's
and every worker starts from it; the step it INITs under ``STEP_KEY`` tells every worker which of its own
checkpoints to take the optimizer state from (a worker without that one is refused by name). A checkpoint of
another model or other training settings is refused naming the difference.

Usage (inside the wrapper)::

    mine = WorkerCheckpoints(spec, rank=0, settings=plan_settings(topology))
    mine.maybe_write(step, model, optimizer)           # after every step
    step = mine.newest()                               # --resume: the master's choice
    mine.load(step, model, optimizer)                  # every worker, that step
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..config import CheckpointSpec, ConfigError
from ..core.checkpoints import settings_difference
from ..runs.checkpoint import CheckpointError, manifests, sha256, write_atomically

log = logging.getLogger("geomx.torch")

FORMAT_VERSION = 1


def worker_dir(folder: Path, rank: int) -> Path:
    """Where worker ``rank`` (its global rank) keeps its checkpoints."""
    return Path(folder) / "workers" / f"worker{rank}"


def _shapes(state: dict[str, Any]) -> dict[str, list[int]]:
    return {name: list(value.shape) for name, value in state.items() if isinstance(value, torch.Tensor)}


def model_difference(saved: dict[str, list[int]], current: dict[str, list[int]]) -> str | None:
    """The first differences between a checkpoint's model and this one, named (None: the same names and shapes)."""
    problems = [f"{name} is missing from this model" for name in saved if name not in current]
    problems += [f"{name} is not in the checkpoint" for name in current if name not in saved]
    problems += [f"{name} is {current[name]} here but {saved[name]} in the checkpoint"
                 for name in saved if name in current and saved[name] != current[name]]
    if not problems:
        return None
    more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
    return "; ".join(problems[:3]) + more


class WorkerCheckpoints:
    """One worker's checkpoint folder: when to write, writing, and loading a given step (module docstring)."""

    def __init__(self, spec: CheckpointSpec, rank: int, settings: dict[str, Any], every: int | None = None,
                 with_model: bool = True) -> None:
        if spec.dir is None:
            raise ValueError("WorkerCheckpoints needs checkpoint.dir")
        if spec.every_steps <= 0:  # time alone would let each worker checkpoint at other steps
            raise ConfigError("checkpoint.every_seconds alone cannot be used where the workers hold the model and "
                              "the optimizer state (the wrapper's default FSA plan: its optimizer steps on every "
                              "worker): their checkpoints must be of the same steps; set checkpoint.every_steps")
        self.spec = spec
        self.every = every if every is not None else spec.every_steps  # steps between two checkpoints
        self.with_model = with_model  # load restores the parameters too (else the global servers hand them out)
        self.folder = worker_dir(spec.dir, rank)
        self.settings = settings
        self.written: list[int] = []

    def maybe_write(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer) -> bool:
        """Write this worker's checkpoint of ``step`` (steps completed) if one is due; True if written."""
        if step <= 0 or step % self.every:
            return False
        self.write(step, model, optimizer)
        return True

    def write(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer) -> Path:
        """Write the checkpoint of ``step`` now (atomically); keep the newest ``keep``. Returns the manifest."""
        self.folder.mkdir(parents=True, exist_ok=True)
        state = model.state_dict()
        data = self.folder / f"ckpt-{step:09d}.pt"
        write_atomically(data, lambda handle: torch.save({"model": state, "optimizer": optimizer.state_dict()},
                                                         handle))
        manifest = {"format": FORMAT_VERSION, "step": step, "time": time.time(), "data": data.name,
                    "sha256": sha256(data), "model": _shapes(state), "settings": self.settings}
        path = self.folder / f"ckpt-{step:09d}.json"
        write_atomically(path, lambda handle: handle.write(json.dumps(manifest, indent=1).encode()))
        for old in manifests(self.folder)[self.spec.keep:]:
            for stale in (old, old.with_suffix(".pt")):
                stale.unlink(missing_ok=True)
        self.written.append(step)
        return path

    def steps(self) -> list[int]:
        """The steps of this worker's checkpoints on disk, newest first (not yet verified)."""
        return [int(path.stem.split("-")[1]) for path in manifests(self.folder)]

    def newest(self) -> int:
        """The newest step whose checkpoint verifies (each refused one logged); CheckpointError if there is none."""
        for step in self.steps():
            try:
                self._read(step)
                return step
            except CheckpointError as exc:
                log.error("refused checkpoint: %s; trying the previous one", exc)
        raise CheckpointError(f"--resume: no valid checkpoint of this worker in {self.folder} (the optimizer runs "
                              "on the workers, so the model and its state are theirs to resume)")

    def _read(self, step: int) -> tuple[dict[str, Any], dict[str, Any]]:
        path = self.folder / f"ckpt-{step:09d}.json"
        try:
            manifest = json.loads(path.read_text())
            data = path.with_name(str(manifest["data"]))
            if manifest["format"] != FORMAT_VERSION:
                raise CheckpointError(f"{path}: format {manifest['format']} (this geomx reads {FORMAT_VERSION})")
            actual = sha256(data)
            if actual != manifest["sha256"]:
                raise CheckpointError(f"{data}: checksum mismatch (sha256 {actual[:12]}…, the manifest says "
                                      f"{str(manifest['sha256'])[:12]}…); the file is corrupt")
            return manifest, torch.load(data, map_location="cpu", weights_only=True)
        except CheckpointError:
            raise
        except FileNotFoundError as exc:
            raise CheckpointError(f"{path}: missing ({exc.filename})") from None
        except (OSError, ValueError, KeyError, TypeError, RuntimeError) as exc:
            raise CheckpointError(f"{path}: unreadable checkpoint ({type(exc).__name__}: {exc})") from None

    def load(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Load the checkpoint of ``step`` into ``model`` and ``optimizer``; CheckpointError names what is missing
        or different (another model, other training settings)."""
        manifest, saved = self._read(step)
        source = self.folder / f"ckpt-{step:09d}.json"
        difference = model_difference(manifest["model"], _shapes(model.state_dict()))
        if difference is not None:
            raise CheckpointError(f"--resume: {source} is of another model: {difference}")
        changed = settings_difference(manifest.get("settings") or {}, self.settings)
        if changed is not None:
            raise CheckpointError(f"--resume: {source} was written by a job with other training settings ({changed})")
        state = saved["model"]
        if not self.with_model:  # the parameters are the global servers' (INIT); buffers stay each worker's own
            parameters = {name for name, _ in model.named_parameters()}
            state = {name: value for name, value in state.items() if name not in parameters}
        model.load_state_dict(state, strict=self.with_model)
        optimizer.load_state_dict(saved["optimizer"])
        log.info("resumed this worker's %s from %s", "model and optimizer state" if self.with_model
                 else "optimizer state and buffers", source)
