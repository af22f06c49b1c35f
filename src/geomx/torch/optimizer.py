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
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..config import NodeConfig, node_config
from ..kv import KVStore, create
from ..runs.runlog import file_name
from .metrics import StepRecorder, TensorBoardSink
from .plan import Plan, Strategy, make_plan
from .signature import compare, signature

log = logging.getLogger("geomx.torch")

# Keys of the wrapper's own bookkeeping, far above any parameter index.
SIGNATURE_KEY = 1 << 40
CONTROL_KEY = SIGNATURE_KEY + 1


class ModelMismatchError(ValueError):
    """The workers' models do not have the same parameters (raised on every mismatched worker at start)."""


# Modules that only hold others and never use their children's parameters themselves.
_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)


def _layer_of_params(model: nn.Module, params: list[nn.Parameter]) -> tuple[list[int], dict[nn.Module, list[int]]]:
    """Layer index per parameter (modules in definition order) and what each module's forward waits for.

    The root and pure containers wait for their own parameters only; any other module waits for its whole
    subtree, because its forward may use a child's parameters without calling the child (PyTorch's
    attention uses ``out_proj.weight`` directly; its fused inference path skips every child).
    """
    index_of = {id(p): i for i, p in enumerate(params)}
    layers = [0] * len(params)
    seen: set[int] = set()
    waits: dict[nn.Module, list[int]] = {}
    layer = 0
    for module in model.modules():
        own = [index_of[id(p)] for p in module.parameters(recurse=False) if id(p) in index_of]
        own = [k for k in own if k not in seen]  # a shared tensor belongs to its first owner
        if own:
            seen.update(own)
            for key in own:
                layers[key] = layer
            layer += 1
        recurse = not (module is model or isinstance(module, _CONTAINERS))
        keys = sorted({index_of[id(p)] for p in module.parameters(recurse=recurse) if id(p) in index_of})
        if keys:
            waits[module] = keys
    return layers, waits


class DistributedOptimizer:
    """A torch optimizer whose ``step`` runs geomx's configured algorithm. See the module docstring.

    Attributes of the wrapped optimizer (``param_groups``, ``state`` ...) are reachable through this one.
    One ``backward`` per ``step``: a second gradient for a parameter before ``step`` raises.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, model: nn.Module, *,
                 kv: KVStore | None = None, config: NodeConfig | None = None) -> None:
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"DistributedOptimizer wraps a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if not isinstance(model, nn.Module):
            raise TypeError(f"DistributedOptimizer needs the model (an nn.Module), got {type(model).__name__}")
        config = config or (kv.config if kv is not None else node_config())
        self.optimizer = optimizer
        self.model = model
        self.plan: Plan = make_plan(config.topology.training, config.topology.hfa, optimizer)
        self._owns_kv = kv is None
        self.kv = kv if kv is not None else create(self.plan.kvstore_type, config)
        self._params: list[nn.Parameter] = list(model.parameters())
        self._names = [name for name, _ in model.named_parameters()]
        in_model = {id(p) for p in self._params}
        trained: set[int] = set()
        for group in optimizer.param_groups:
            for p in group["params"]:
                if id(p) not in in_model:
                    raise ValueError("the optimizer holds a parameter that is not one of the model's "
                                     f"(shape {tuple(p.shape)}): pass the model the optimizer trains")
                trained.add(id(p))
        self._trained = [k for k, p in enumerate(self._params) if id(p) in trained and p.requires_grad]
        layers, waits = _layer_of_params(model, self._params)
        # training.priorities false: one priority for all, FIFO in the order sent (the bench's P3 control)
        self._priority = [-layer for layer in layers] if config.topology.training.priorities else [0] * len(layers)
        deepest = max(layers, default=0)
        self._deepest = [k for k, layer in enumerate(layers) if layer == deepest]
        self._pending: set[int] = set()  # keys whose new values are on their way
        self._pushed: set[int] = set()  # keys pushed during this step's backward
        self._local_steps = 0
        self._round_steps = config.topology.hfa.k1 if config.topology.hfa else 1
        self._round_started = time.monotonic()
        self._esync_done = False
        self._warned: set[str] = set()
        self._closed = False
        # How much the next forward overlapped the previous step's communication (observed, never waited for):
        # forwards that started before every answer had arrived, and forwards whose first layer had its new
        # values while the deepest layer's were still on their way (P3: shallow slices travel first).
        self.overlap = {"forwards": 0, "forwards_before_all_arrived": 0, "first_layer_before_deepest": 0}
        self._forward_started = False
        self._configure_servers()
        self._check_and_init()
        self._round_started = time.monotonic()  # ESync's first speed report: local steps only, not the init wait
        run_dir = config.run_dir
        sink = (TensorBoardSink(run_dir / "tensorboard" / file_name(self.kv.name))
                if config.topology.training.tensorboard and run_dir is not None else None)
        self.recorder = StepRecorder(self.kv, config.topology.training.metrics_every, sink)
        self.kv.record(step=0, elapsed_s=0.0, plan=self.plan.describe())  # which algorithm this run used
        self._handles: list[Any] = []
        if self.plan.mode in (Strategy.SERVER, Strategy.LOCAL):
            for key in self._trained:
                hook = functools.partial(self._on_gradient, key)
                self._handles.append(self._params[key].register_post_accumulate_grad_hook(hook))
        for module, keys in waits.items():
            self._handles.append(module.register_forward_pre_hook(functools.partial(self._before_forward, keys)))
        if self.kv.is_master_worker:
            log.info("geomx.torch: %s", self.plan.describe())

    # -- setup --------------------------------------------------------------------------------------------
    def _configure_servers(self) -> None:
        if not self.kv.is_master_worker:
            return
        if self.plan.compression:
            self.kv.set_gradient_compression(self.plan.compression)
        if self.plan.server_optimizer is not None:
            self.kv.set_optimizer(self.plan.server_optimizer)

    def _check_and_init(self) -> None:
        mine = signature(self.model)
        masters = mine.clone()
        self.kv.init(SIGNATURE_KEY, masters)
        problem = compare(mine, masters, self.model)
        if problem:
            raise ModelMismatchError(f"{self.kv.name}: the workers' models differ: {problem}")
        self.kv.init(list(range(len(self._params))), [p.data for p in self._params])
        if self.plan.mode is Strategy.ESYNC:
            self.kv.init(CONTROL_KEY, torch.zeros(1))

    # -- hooks --------------------------------------------------------------------------------------------
    def _on_gradient(self, key: int, param: torch.Tensor) -> None:
        if self._closed:
            return
        if key in self._pushed:
            raise RuntimeError(f"parameter {self._names[key]!r} got a second gradient before step(): geomx pushes "
                               "each gradient as backward produces it, so call step() after every backward")
        self._await([key])  # a parameter the last forward did not use may still be on its way
        assert param.grad is not None
        self.kv.push(key, param.grad, priority=self._priority[key])
        self._pushed.add(key)

    def _before_forward(self, keys: list[int], module: nn.Module, args: Any) -> None:
        first = not self._forward_started
        if first:
            self._forward_started = True
            self.overlap["forwards"] += 1
            if self._pending and not all(self.kv.ready(k) for k in self._pending):
                self.overlap["forwards_before_all_arrived"] += 1
        self._await(keys)
        if first and any(k in self._pending and not self.kv.ready(k) for k in self._deepest):
            self.overlap["first_layer_before_deepest"] += 1

    def _await(self, keys: list[int]) -> None:
        waiting = [k for k in keys if k in self._pending]
        if not waiting:
            return
        started = time.monotonic()
        for key in waiting:
            self.kv.pull(key, self._params[key], priority=self._priority[key])
            self._pending.discard(key)
        self.recorder.waited(time.monotonic() - started)

    # -- the torch.optim.Optimizer surface ----------------------------------------------------------------
    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One training step under the configured algorithm; returns ``closure()``'s loss if given."""
        if self._closed:
            raise RuntimeError("this DistributedOptimizer is closed")
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        mode = self.plan.mode
        if mode is Strategy.SERVER:
            self._push_missing()
            self._pending.update(self._pushed)
            self._pushed.clear()
        elif mode is Strategy.LOCAL:
            self._push_missing()
            self._pushed.clear()
            self._average_gradients()  # the answers are gradient sums: into .grad, then a local step
            self.optimizer.step()
        elif self._esync_done:
            self._warn_once("esync", "ESync: a worker ran out of data and the job's last round is over; "
                                     "the remaining steps of this loop do not train")
        else:
            self.synchronize()
            self.optimizer.step()
            self._local_steps += 1
            if self._local_steps % self._round_steps == 0:
                self._sync_models(finishing=False)
        self._forward_started = False
        self.recorder.step()
        return loss

    def _push_missing(self) -> None:
        """FSA rounds need every worker's push of every key: parameters without a gradient push zeros."""
        for key in self._trained:
            if key not in self._pushed:
                self._warn_once(f"nograd{key}", f"parameter {self._names[key]!r} had no gradient in a step: "
                                                 "pushing zeros for it")
                self._await([key])
                self.kv.push(key, torch.zeros_like(self._params[key]), priority=self._priority[key])
                self._pushed.add(key)

    def _average_gradients(self) -> None:
        started = time.monotonic()
        scale = 1.0 / self.kv.num_all_workers
        for key in self._trained:
            param = self._params[key]
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            self.kv.pull(key, param.grad, priority=self._priority[key])
            param.grad.mul_(scale)
        self.recorder.waited(time.monotonic() - started)

    def _sync_models(self, finishing: bool) -> None:
        """HFA/ESync: push every model tensor / workers of this party; the answers land lazily."""
        per_step = (time.monotonic() - self._round_started) / max(self._round_steps, 1)
        for key in range(len(self._params)):
            self.kv.push(key, self._params[key].data / self.kv.num_workers, priority=self._priority[key])
        self._pending.update(range(len(self._params)))
        if self.plan.mode is Strategy.ESYNC:
            flag = torch.full((1,), (1.0 if finishing else 0.0) / self.kv.num_workers)
            self.kv.push(CONTROL_KEY, flag, priority=1)
            started = time.monotonic()
            control = torch.zeros(1)
            self.kv.pull(CONTROL_KEY, control, priority=1)
            if float(control[0]) > 0:
                self._esync_done = True
            else:
                self._round_steps = self.kv.assign_local_steps(per_step, base_steps=self._round_steps_base())
            self.recorder.waited(time.monotonic() - started)
        self._local_steps = 0
        self._round_started = time.monotonic()

    def _round_steps_base(self) -> int:
        hfa = self.kv.config.topology.hfa
        return hfa.k1 if hfa else 1

    def _warn_once(self, tag: str, text: str) -> None:
        if tag not in self._warned:
            self._warned.add(tag)
            log.warning("[%s] %s", self.kv.name, text)

    # -- extras -------------------------------------------------------------------------------------------
    def log(self, **metrics: Any) -> None:
        """Add ``loss`` (averaged into the next metrics record) or ``accuracy`` etc. (written at once)."""
        self.recorder.log(**metrics)

    def synchronize(self) -> None:
        """Wait for every update still on its way (before reading or saving the weights outside forward)."""
        self._await(sorted(self._pending))

    def close(self) -> None:
        """Finish: the last updates land in the model, metrics are written, the worker leaves the job."""
        if self._closed:
            return
        try:
            if self.plan.mode is Strategy.ESYNC and not self._esync_done:
                self._sync_models(finishing=True)
            self.synchronize()
            self.recorder.close()
        finally:
            self._closed = True
            for handle in self._handles:
                handle.remove()
            if self._owns_kv:
                self.kv.close()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name in ("optimizer", "kv", "model", "plan", "recorder"):
            raise AttributeError(name)
        return getattr(self.optimizer, name)

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state)

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
