"""``DistributedOptimizer``: wrap a torch optimizer, keep the training loop, train across data centers.

The algorithm comes from the topology or environment (see ``plan.py``), never from the loop:

- gradients leave from autograd hooks as soon as backward produces each one (per tensor, priority
  ``-layer index``: shallow layers overtake deep ones in every send queue), so communication overlaps
  the rest of backward;
- the servers' answers land lazily: a forward pre-hook on each module waits only for that module's own
  parameters, so the next forward starts before the deepest layers' updates have arrived (P3's overlap;
  with P3 on, tensors also travel as ~50K-element slices so shallow layers never wait behind a big one);
- initial weights are the master worker's (``kv.init``), after a check that every worker has the same
  parameter shapes.

Usage (the five changed lines of a plain PyTorch loop)::

    import geomx.torch as gx
    train_set = gx.shard(train_set)
    opt = gx.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-3), model)
    for x, y in DataLoader(train_set, batch_size=32):
        opt.zero_grad(); loss = F.cross_entropy(model(x), y); loss.backward(); opt.step()
        opt.log(loss=loss)                       # optional: loss/accuracy in the run's metrics
    opt.close()
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import torch
from torch import nn

from ..algorithms.modes import Lan
from ..algorithms.registry import strategy_class
from ..collective.ddp import check_group, unwrap
from ..collective.fsdp import fsdp1_refusal, fsdp_shards, is_sharded
from ..config import ConfigError, NodeConfig, node_config
from ..core.strategy import SIGNATURE_KEY, WorkerStrategy
from ..kv import KVStore, create
from ..runs.runlog import file_name
from .amp import grad_scaler_skips
from .checkpoint import init_from_checkpoints, worker_checkpoints
from .digest import ModelDigests
from .hooks import Hook, layer_of_params, uncompiled
from .join import UnevenLoops
from .loop_checks import refuse_changed, state_elsewhere
from .metrics import StepRecorder, TensorBoardSink
from .plan import Plan, leads_party, make_plan
from .signature import compare, signature
from .start import refuses_config

log = logging.getLogger("geomx.torch")

class ModelMismatchError(ValueError):
    """The workers' models do not have the same parameters (raised on every mismatched worker at start)."""


class DistributedOptimizer:
    """A torch optimizer whose ``step`` runs geomx's configured algorithm. See the module docstring.

    Attributes of the wrapped optimizer (``param_groups``, ``state`` ...) are reachable through this one.
    One ``backward`` per ``step``: a second gradient for a parameter before ``step`` raises.

    This class is the mechanism (hooks, answers on their way, metrics); what ``step`` does is its
    ``strategy``'s (``geomx.core.strategy``), chosen once from the plan. ``params``, ``names``, ``trained``,
    ``priority``, ``pending`` and ``pushed`` are what the strategy reads and updates.
    """

    # torch.amp.GradScaler calls step() with ``grad_scale`` and ``found_inf`` set, leaving the unscaling and the skip
    _step_supports_amp_scaling = True  # to the wrapper (geomx.torch.amp): every worker skips the same steps

    @refuses_config  # a job that cannot start says so in one line (geomx.torch.start)
    def __init__(self, optimizer: torch.optim.Optimizer, model: nn.Module, *,
                 kv: KVStore | None = None, config: NodeConfig | None = None) -> None:
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"DistributedOptimizer wraps a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if not isinstance(model, nn.Module):
            raise TypeError(f"DistributedOptimizer needs the model (an nn.Module), got {type(model).__name__}")
        config = config or (kv.config if kv is not None else node_config())
        self.optimizer = optimizer
        # a script's own DDP: trained through the module it wraps; the strategy says who averages (collective.ddp)
        model, compiled = uncompiled(model)  # torch.compile(model) or torch.compile(DDP(model)): trained through
        model, self.ddp = unwrap(model)  # the module it wraps (the same names as uncompiled; geomx.torch.hooks)
        if compiled is None:
            model, _ = uncompiled(model)  # DDP(torch.compile(model))
        self.model = model
        refusal = fsdp1_refusal(model)
        if refusal is not None:  # before the job is joined: its flat parameters are shards that look whole
            raise ConfigError(f"party {config.party}: {refusal}")
        self.plan: Plan = make_plan(config.topology.training, config.topology.hfa, optimizer, leads_party(config),
                                    config.topology.size_lower_bound)
        self._owns_kv = kv is None
        self.kv = kv if kv is not None else create(self.plan.kvstore_type, config)
        self.params: list[nn.Parameter] = list(model.parameters())
        self.names = [name for name, _ in model.named_parameters()]
        in_model = {id(p) for p in self.params}
        trained: set[int] = set()
        for group in optimizer.param_groups:
            for p in group["params"]:
                if id(p) not in in_model:
                    raise ValueError("the optimizer holds a parameter that is not one of the model's "
                                     f"(shape {tuple(p.shape)}): pass the model the optimizer trains")
                trained.add(id(p))
        self.trained = [k for k, p in enumerate(self.params) if id(p) in trained and p.requires_grad]
        # compiled or not, each module waits for its own answers: under torch.compile the hooks run eagerly, each a
        # graph break (geomx.torch.hooks), which also keeps torch 2.13 inductor's MaxPool2d backward right
        layers, waits = layer_of_params(model, self.params)
        # training.priorities false: one priority for all, FIFO in the order sent (the bench's P3 control)
        self.priority = [-layer for layer in layers] if config.topology.training.priorities else [0] * len(layers)
        deepest = max(layers, default=0)
        self._deepest = [k for k, layer in enumerate(layers) if layer == deepest]
        self.pending: set[int] = set()  # keys whose new values are on their way
        self.pushed: set[int] = set()  # keys pushed during this step's backward
        self._warned: set[str] = set()
        self._closed = False
        # How much the next forward overlapped the previous step's communication (observed, never waited for):
        # forwards that started before every answer had arrived, and forwards whose first layer had its new
        # values while the deepest layer's were still on their way (P3: shallow slices travel first).
        self.overlap = {"forwards": 0, "forwards_before_all_arrived": 0, "first_layer_before_deepest": 0}
        self._forward_started = False
        self._accumulating = False  # inside ``no_sync()``: backward's gradients stay in .grad
        self._averaged = False  # ``average_gradients`` ran this step: the step's gradients are final
        self._got: set[int] = set()  # keys whose gradient backward made this step (outside ``no_sync()``)
        self._sent: dict[int, tuple[torch.Tensor, int]] = {}  # key -> the .grad its hook sent, and its version then
        self._skip_update = False  # this step's gradients are not finite under a GradScaler: no update
        self._joins: UnevenLoops | None = None  # uneven loops in a collective party: made at the first ``join()``
        collective = config.topology.is_collective(config.party)
        shards = None  # the keys an FSDP2 script sharded, in a collective party
        # the strategies' seam to the party's ranks (geomx.core.ranks), in a collective party; None elsewhere
        self.ranks = ranks = self.kv.ranks if collective else None
        if collective:  # the party's ranks are one torch.distributed group (lan: collective)
            assert ranks is not None, "a collective party's kvstore joined its group"
            if self.ddp is not None:
                check_group(self.ddp, ranks.group)
            shards = fsdp_shards(self.params, ranks.group.world_size, self.names, config.party)
            if self.plan.compression:  # each rank encodes the slices it owns, residuals included
                ranks.use_compression(self.plan.compression)
        elif self.ddp is not None:
            raise ConfigError(f"party {config.party}: the model is wrapped in DistributedDataParallel, which averages "
                              "gradients over a torch.distributed group; in a lan: server party the local server "
                              "does that: set lan: collective for it, or pass the model without DDP")
        elif any(is_sharded(p) for p in self.params):
            raise ConfigError(f"party {config.party}: the model is sharded by FSDP2 (fully_shard), which needs the "
                              "party's ranks to be one torch.distributed group: set lan: collective for it")
        lan = Lan.SHARDED if shards is not None else Lan.COLLECTIVE if collective else Lan.SERVER
        self.strategy: WorkerStrategy = strategy_class(self.plan.mode, lan)(self)
        self._config = config
        self.start_step = 0  # the job's step this worker starts at: a resumed job's checkpoint step (--resume)
        self.steps_done = 0  # the job's steps completed, counted from start_step
        self.tokens: int | None = None  # samples step(tokens=) counted since the strategy last took them
        self._step_taken = False  # this step's checkpoint was considered (``update``)
        self.checkpoints = worker_checkpoints(self, config, sharded=shards is not None)
        if self.kv.is_master_worker:  # the servers' codec and optimizer, before any round
            if self.plan.compression:
                self.kv.set_gradient_compression(self.plan.compression)
            if self.plan.server_optimizer is not None:
                self.kv.set_optimizer(self.plan.server_optimizer)
        self._check_and_init()
        # the model's digests for the status page, where every party holds the same model (geomx.torch.digest)
        self.digests = ModelDigests.of(self, config.topology.timeouts.heartbeat_interval_s)
        run_dir = config.run_dir
        sink = (TensorBoardSink(run_dir / "tensorboard" / file_name(self.kv.name))
                if config.topology.training.tensorboard and run_dir is not None else None)
        self.recorder = StepRecorder(self.kv, config.topology.training.metrics_every, sink, self.start_step)
        self.kv.record(step=self.start_step, elapsed_s=0.0, plan=self.plan.describe())  # which algorithm this run used
        self._handles: list[Any] = []
        for key in self.trained:  # every plan: a second backward is refused alike (pushed or not)
            hook = Hook(functools.partial(self._on_gradient, key))
            self._handles.append(self.params[key].register_post_accumulate_grad_hook(hook))
        for module, keys in waits.items():
            hook = Hook(functools.partial(self._before_forward, keys))
            self._handles.append(module.register_forward_pre_hook(hook))
        if self.kv.is_master_worker:
            log.info("geomx.torch: %s", self.plan.describe())

    # -- setup --------------------------------------------------------------------------------------------
    def _check_and_init(self) -> None:
        mine = signature(self.model)
        masters = mine.clone()
        self.kv.init(SIGNATURE_KEY, masters)
        problem = compare(mine, masters, self.model)
        if problem:
            raise ModelMismatchError(f"{self.kv.name}: the workers' models differ: {problem}")
        self.start_step = self.steps_done = init_from_checkpoints(self, self._config)
        self.strategy.init_keys()

    # -- hooks --------------------------------------------------------------------------------------------
    def _on_gradient(self, key: int, param: torch.Tensor) -> None:
        if self._closed:
            return
        if self._accumulating or (self.ddp is not None and not self.ddp.require_backward_grad_sync):
            return  # a backward inside ``no_sync()`` (this one's, or the script's DDP's): the gradient accumulates
        if self._averaged:
            raise RuntimeError(f"parameter {self.names[key]!r} got a gradient after average_gradients() and before "
                               "step(): the step's gradients were final; call backward before average_gradients()")
        if key in self._got:  # refused under every plan, so that a loop runs under any the topology names
            raise RuntimeError(f"parameter {self.names[key]!r} got a second gradient before step(): for gradient "
                               "accumulation use `with opt.no_sync():` for the first backwards (as with DDP), then "
                               "the last backward and step(); otherwise call step() after every backward")
        self._got.add(key)
        if not self.strategy.pushes_gradients:
            return  # this plan sends nothing from backward (local SGD's inner steps): step() applies .grad as it is
        self.await_keys([key])  # a parameter the last forward did not use may still be on its way
        assert param.grad is not None
        self.strategy.on_gradient(key, param.grad)
        if self.ddp is None:  # (the script's DDP copies its buckets back into .grad after backward)
            self._sent[key] = (param.grad, param.grad._version)  # a later change is lost: loop_checks refuses it

    def push_gradients(self) -> None:
        """Push every trained parameter's ``.grad`` now, deepest layer first, as backward's hooks would: for a loop
        whose gradients come from elsewhere than autograd (the bench's accelerator stand-in). Then ``step()``.
        Usage: ``opt.push_gradients(); opt.step()``"""
        if not self.strategy.pushes_gradients:
            return  # this algorithm sends the model (or its change) from step(), not gradients
        for key in reversed(self.trained):
            param = self.params[key]
            if param.grad is None:
                raise ValueError(f"parameter {self.names[key]!r} has no gradient to push")
            self._on_gradient(key, param)

    def _before_forward(self, keys: list[int], module: nn.Module, args: Any) -> None:
        first = not self._forward_started
        if first:
            self._forward_started = True
            self.overlap["forwards"] += 1
            if self.pending and not all(self.kv.ready(k) for k in self.pending):
                self.overlap["forwards_before_all_arrived"] += 1
        self.await_keys(keys)
        if first and any(k in self.pending and not self.kv.ready(k) for k in self._deepest):
            self.overlap["first_layer_before_deepest"] += 1

    def await_keys(self, keys: Sequence[int]) -> None:
        """Land the answers of ``keys`` still on their way."""
        waiting = [k for k in keys if k in self.pending]
        if not waiting:
            return
        started = time.monotonic()
        for key in waiting:
            self.kv.pull(key, self.params[key], priority=self.priority[key])
            self.pending.discard(key)
        self.waited(time.monotonic() - started)

    def waited(self, seconds: float) -> None:
        """Count ``seconds`` spent waiting for the network in this step (the metrics' wait share)."""
        self.recorder.waited(seconds)

    # -- the torch.optim.Optimizer surface ----------------------------------------------------------------
    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimizer's ``state_dict()``. Where the optimizer state lives elsewhere (on the global servers:
        the wrapped optimizer never steps, so its ``state`` is empty; or an outer optimizer's, under HFA), the dict
        says so under ``"geomx"`` (and a warning, once), so that a checkpoint of the script's own is not silently
        without it. ``load_state_dict`` (the wrapped one's) takes the dict back, ignoring the note.
        Usage: ``torch.save(opt.state_dict(), path)``"""
        state = self.optimizer.state_dict()
        where = state_elsewhere(self.plan)
        if where is not None:
            self.warn_once("state_dict", f"opt.state_dict(): {where}")
            state["geomx"] = {"optimizer_state": where}
        return state

    def step(self, closure: Callable[[], Any] | None = None, tokens: int | None = None) -> Any:
        """One training step under the configured algorithm; returns ``closure()``'s loss if given. ``tokens``: the
        samples (tokens) the step trained on, by which decoupled HFA rounds (``training.quorum``) weigh the parties."""
        self.tokens = self.tokens if tokens is None else (self.tokens or 0) + tokens
        if self._closed:
            raise RuntimeError("this DistributedOptimizer is closed")
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._joins is not None and self._joins.counting:  # the party counts who still trains (torch/join.py)
            self._joins.count(training=True)
        grads = (g for g in (self.params[key].grad for key in self.trained) if g is not None)  # read if scaled
        self._skip_update = grad_scaler_skips(self.__dict__, grads, self._averaged)  # a GradScaler's call
        refuse_changed(self, "step()")  # a gradient changed after its hook sent it (after average_gradients(): none)
        self._step_taken = False
        if self.digests is not None:
            self.digests.before_step()
        self.strategy.step()
        self._averaged = False
        self._got.clear()
        self._forward_started = False
        self.steps_done += 1
        self.recorder.step()
        return loss

    def update(self) -> None:
        """The wrapped optimizer's step (the strategy's call), unless a GradScaler found the gradients not finite;
        then this worker's checkpoint of the step, when due (before the strategy sends anything more)."""
        if not self._skip_update:
            self.optimizer.step()
        if self.checkpoints is not None and not self._step_taken:
            self._step_taken = True
            number = self.strategy.checkpoint_number(self.steps_done + 1)
            if number is not None:
                self.checkpoints.maybe_write(number, self.model, self.optimizer, step=self.steps_done + 1)

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Gradient accumulation, as DDP's ``no_sync``: the backwards inside add to ``.grad`` and send nothing;
        the first one after it sends the sum (or the algorithm averages it at the step).
        Usage: ``with opt.no_sync(): loss_a.backward()`` then ``loss_b.backward(); opt.step()``"""
        accumulating, self._accumulating = self._accumulating, True
        try:
            yield
        finally:
            self._accumulating = accumulating

    def join(self) -> AbstractContextManager[None]:
        """Uneven loops in a collective party, as DDP's ``Join`` (``geomx.torch.join``): a rank whose loop ended
        takes zero-gradient steps beside the others until all have. Usage: ``with opt.join(): for x, y in loader:``"""
        self._joins = self._joins or UnevenLoops.of(self)  # made once, by every rank alike (a group of its own)
        return self._joins.block()

    def average_gradients(self) -> None:
        """Every trained parameter's ``.grad`` = the gradient ``step()`` will apply, now, as DDP leaves it after
        backward: the job's mean under FSA with the optimizer on the workers, the party's in a collective party's
        inner steps, this worker's own in local SGD's (HFA in a server party). For clipping or reading the
        gradients; ``step()`` then applies them as they are. RuntimeError where the global servers run the
        optimizer on the gradients pushed during backward.
        Usage: ``loss.backward(); opt.average_gradients(); clip_grad_norm_(model.parameters(), 1.0); opt.step()``"""
        if self._closed:
            raise RuntimeError("this DistributedOptimizer is closed")
        refuse_changed(self, "average_gradients()")
        self.strategy.average_gradients()
        self._averaged = True

    def warn_once(self, tag: str, text: str) -> None:
        """Log ``text`` once per ``tag``."""
        if tag not in self._warned:
            self._warned.add(tag)
            log.warning("[%s] %s", self.kv.name, text)

    # -- extras -------------------------------------------------------------------------------------------
    def log(self, **metrics: Any) -> None:
        """Add ``loss`` (averaged into the next metrics record) or ``accuracy`` etc. (written at once)."""
        self.recorder.log(**metrics)

    def load_job_model(self, into: nn.Module) -> None:
        """Write the job's model into ``into``, a model shaped as the wrapped one (a copy for evaluation).

        Under FSA every worker holds the job's model; under HFA a worker's own model between global rounds is
        its party's, and the job's is the global model as the party's local server holds it (no WAN traffic).
        Usage: ``eval_model = copy.deepcopy(model); opt.load_job_model(eval_model); evaluate(eval_model)``
        """
        tensors = [p.data for p in into.parameters()]
        if [t.shape for t in tensors] != [p.shape for p in self.params]:
            raise ValueError("load_job_model needs a model shaped as the wrapped one (a copy of it)")
        self.strategy.load_job_model(tensors)

    def synchronize(self) -> None:
        """Wait for every update still on its way (before reading or saving the weights outside forward)."""
        self.await_keys(sorted(self.pending))

    def close(self) -> None:
        """Finish: the last updates land in the model, metrics are written, the worker leaves the job."""
        if self._closed:
            return
        try:
            self.strategy.finish()
            self.synchronize()
            if self.digests is not None:  # the final model, compared across parties however few steps ran
                self.digests.at_close()
            self.recorder.close()
        finally:
            self._closed = True
            for handle in self._handles:
                handle.remove()
            if self._owns_kv:
                self.kv.close()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name in ("optimizer", "kv", "ranks", "model", "plan", "recorder", "strategy"):
            raise AttributeError(name)
        return getattr(self.optimizer, name)

    @property
    def is_master_worker(self) -> bool:
        return self.kv.is_master_worker

    @property
    def global_rank(self) -> int:
        return self.kv.global_rank

    @property
    def num_all_workers(self) -> int:
        return self.kv.num_all_workers

    def __enter__(self) -> DistributedOptimizer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
