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

Under HFA the global servers hold the global model and the outer optimizer's state; each worker writes its inner
optimizer's state (and the model's buffers) at the steps of the servers' checkpoints (every ``every_steps`` global
rounds: K1 x K2 steps each; under streaming a cycle of every fragment), and a resumed worker takes the global model
from INIT, its step from the servers' completed rounds, and that step's state from its own checkpoint. Under ESync
a round is of each worker's own steps, so a worker's checkpoints go by global rounds (``ckpt-<rounds>``), each
recording the worker's step (``loop_step``), which is where it resumes. Under decoupled rounds with a quorum below
every party the global rounds go on without a slow party, whose workers may then have no checkpoint of the servers'
step: each takes its newest one before it and goes on from that step with the checkpoint's global model.

Usage (inside the wrapper)::

    opt.checkpoints = worker_checkpoints(opt, config, sharded=False)   # None where the servers hold it all
    opt.start_step = init_from_checkpoints(opt, config)                # INIT the model, resumed or fresh
    opt.checkpoints.maybe_write(step, model, optimizer)                # after every optimizer step
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from ..config import CheckpointSpec, ConfigError, NodeConfig, plan_settings, settings_difference
from ..core.strategy import STEP_KEY, WorkerStrategy
from ..runs.checkpoint import CheckpointError, checked_data, manifests, prune, sha256, step_of, write_atomically
from .plan import Plan, Strategy

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
        if spec.every_steps <= 0 or spec.every_s > 0:  # by time, each would checkpoint at steps of its own
            raise ConfigError(f"checkpoint.every_seconds ({spec.every_s:g}) cannot be used where the workers hold "
                              "part of what a resume needs (the model and the optimizer state under the wrapper's "
                              "default FSA plan, the inner optimizer's state under HFA): the global servers and "
                              "every worker must checkpoint the same steps, so set checkpoint.every_steps alone")
        self.spec = spec
        self.every = every if every is not None else spec.every_steps  # steps between two checkpoints
        self.with_model = with_model  # load restores the parameters too (else the global servers hand them out)
        self.folder = worker_dir(spec.dir, rank)
        self.settings = settings
        self.written: list[int] = []
        self._verified: tuple[int, tuple[dict[str, Any], dict[str, Any]]] | None = None  # newest()'s read, for load

    def maybe_write(self, number: int, model: nn.Module, optimizer: torch.optim.Optimizer,
                    step: int | None = None) -> bool:
        """Write this worker's checkpoint ``number`` (its steps completed, or under ESync the global rounds:
        ``WorkerStrategy.checkpoint_number``) if one is due; ``step``: the loop's step, where not ``number``.
        True if written."""
        if number <= 0 or number % self.every:
            return False
        self.write(number, model, optimizer, step)
        return True

    def write(self, number: int, model: nn.Module, optimizer: torch.optim.Optimizer, step: int | None = None) -> Path:
        """Write checkpoint ``number`` now (atomically); keep the newest ``keep``. Returns the manifest."""
        self.folder.mkdir(parents=True, exist_ok=True)
        state = model.state_dict()
        data = self.folder / f"ckpt-{number:09d}.pt"
        write_atomically(data, lambda handle: torch.save({"model": state, "optimizer": optimizer.state_dict()},
                                                         handle))
        manifest = {"format": FORMAT_VERSION, "step": number, "loop_step": number if step is None else step,
                    "time": time.time(), "data": data.name, "sha256": sha256(data), "model": _shapes(state),
                    "settings": self.settings}
        path = self.folder / f"ckpt-{number:09d}.json"
        write_atomically(path, lambda handle: handle.write(json.dumps(manifest, indent=1).encode()))
        prune(self.folder, self.spec.keep, ".pt")
        self.written.append(number)
        return path

    def steps(self) -> list[int]:
        """The steps of this worker's checkpoints on disk, newest first (not yet verified)."""
        return [step_of(path) for path in manifests(self.folder)]

    def newest(self, at_most: int | None = None) -> int:
        """The newest step (at most ``at_most``) whose checkpoint verifies (each refused one logged); CheckpointError
        if there is none."""
        for step in self.steps():
            if at_most is not None and step > at_most:
                continue
            try:
                self._verified = (step, self._read(step))  # what load() of it takes, not read again
                return step
            except CheckpointError as exc:
                log.error("refused checkpoint: %s; trying the previous one", exc)
        raise CheckpointError(f"--resume: no valid checkpoint of this worker in {self.folder} (the optimizer runs "
                              "on the workers, so the model and its state are theirs to resume)")

    def _read(self, step: int) -> tuple[dict[str, Any], dict[str, Any]]:
        path = self.folder / f"ckpt-{step:09d}.json"
        try:
            manifest = json.loads(path.read_text())
            if manifest["format"] != FORMAT_VERSION:
                raise CheckpointError(f"{path}: format {manifest['format']} (this geomx reads {FORMAT_VERSION})")
            return manifest, torch.load(checked_data(path, manifest), map_location="cpu", weights_only=True)
        except CheckpointError:
            raise
        except FileNotFoundError as exc:
            raise CheckpointError(f"{path}: missing ({exc.filename})") from None
        except (OSError, ValueError, KeyError, TypeError, RuntimeError) as exc:
            raise CheckpointError(f"{path}: unreadable checkpoint ({type(exc).__name__}: {exc})") from None

    def load(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
        """Load checkpoint ``step`` (its number) into ``model`` and ``optimizer`` and return the loop's step it was
        written at; CheckpointError names what is missing or different (another model, other training settings)."""
        verified, self._verified = self._verified, None
        manifest, saved = verified[1] if verified is not None and verified[0] == step else self._read(step)
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
        return int(manifest.get("loop_step", manifest["step"]))


class Resumable(Protocol):
    """What resuming needs of the wrapper (``geomx.torch.DistributedOptimizer``)."""

    kv: Any
    model: nn.Module
    optimizer: torch.optim.Optimizer
    params: list[nn.Parameter]
    strategy: WorkerStrategy
    plan: Plan
    checkpoints: WorkerCheckpoints | None


def worker_checkpoints(loop: Resumable, config: NodeConfig, sharded: bool) -> WorkerCheckpoints | None:
    """This worker's own checkpoints, where its optimizer steps: the model and the optimizer state where the global
    servers hold gradient sums (FSA with the optimizer on the workers), the optimizer state where they hold the
    global model (HFA's inner optimizer); None where the optimizer runs on the global servers (their checkpoints
    hold it; the wrapped optimizer never steps), or without checkpoint.dir."""
    spec = config.topology.checkpoint
    if spec.dir is None or loop.plan.mode is Strategy.SERVER:
        return None
    per_round = loop.strategy.steps_of(1)  # None (ESync): the checkpoints go by global rounds, every_steps of them
    if sharded:  # the fix said is the one this plan has: HFA's and ESync's inner optimizer steps on the ranks always
        fix = ("set training.server_optimizer: translate (the global servers then hold the model and the optimizer "
               "state, and checkpoint them), or leave checkpoint.dir out" if loop.plan.mode is Strategy.LOCAL else
               "under HFA (DiLoCo, streaming, ESync) the inner optimizer steps on the ranks whatever the server "
               "optimizer: leave checkpoint.dir out")
        raise ConfigError(f"party {config.party}: checkpoints of a model sharded by FSDP2 with its optimizer on the "
                          f"ranks are not written yet (each rank's shards would need one): {fix}")
    return WorkerCheckpoints(spec, loop.kv.global_rank, plan_settings(config.topology),
                             every=spec.every_steps * (per_round or 1), with_model=loop.strategy.keeps_model)


def init_from_checkpoints(loop: Resumable, config: NodeConfig) -> int:
    """INIT the model's keys (the master's values win) and return the step the job starts at: 0 on a fresh start;
    on ``--resume`` the checkpoint's, with every worker's model and optimizer state restored (module docstring).
    The step travels under ``STEP_KEY``: the master's, or a resumed global server's completed rounds (each worker's
    own step under ESync, whose rounds are of as many steps as each worker's speed gets: its checkpoint of them)."""
    mine = loop.checkpoints
    keeps_model = loop.strategy.keeps_model
    master = loop.kv.is_master_worker
    resumed = None  # the master's own checkpoint's step, where the workers hold the model
    if config.resume and mine is not None and keeps_model and master:
        resumed = mine.newest()  # its model is what the master INITs: every worker's start
        mine.load(resumed, loop.model, loop.optimizer)
    loop.kv.init(list(range(len(loop.params))), [p.data for p in loop.params])
    if config.topology.checkpoint.dir is None:
        return 0
    told = torch.tensor([float(resumed or 0)], dtype=torch.float64)
    loop.kv.init(STEP_KEY, told)  # the master's step, or a resumed global server's completed rounds
    rounds = int(told.item())
    step = rounds if keeps_model else loop.strategy.steps_of(rounds)
    number = rounds if step is None else step  # ESync: this worker's checkpoint of those rounds tells its step
    if config.resume and mine is not None and not (keeps_model and master):
        # the optimizer state (and the model where it is the workers'); the step where rounds do not tell it
        if step is not None and loop.strategy.resumes_behind():  # its party may not have got as far as the rounds
            number = mine.newest(at_most=number)
        step = mine.load(number, loop.model, loop.optimizer)
    if step is None:  # a fresh start, or no checkpoints of this worker's
        return 0
    if config.resume and master:
        log.info("geomx.torch: the job resumes at step %d", step)
    return step
