"""Server optimizers: what the global servers run on the aggregated gradient.

An optimizer travels as a name plus hyperparameters (JSON), never as code. The worker builds the spec;
the global server rebuilds the optimizer through the registry and keeps its state per (key, slice).

Servers *sum* what their clients push. ``rescale_grad`` turns that sum into what the update uses:
left as None, the master worker fills in ``1 / num_all_workers``, so the optimizer sees the mean of the
workers' gradients, and one geomx step equals one single-process step over the union of the batches.
Pass ``rescale_grad=1.0`` for GeoMX's behaviour (the raw sum).

Usage::

    kv.set_optimizer(geomx.optim.SGD(lr=0.1, momentum=0.9))
    optimizer = optimizer_from_spec({"name": "sgd", "params": {"lr": 0.1}})   # on the server
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from .protocol.wire import SliceId

# The arithmetic is NumPy float32, in torch.optim's operation order (its single-tensor path), so a global server
# never imports torch (~1.6 CPU-s per process) and still matches torch.optim to float32 rounding.


def _scaled(array: np.ndarray, factor: float) -> np.ndarray:
    """A new float32 array ``factor * array`` (``factor`` rounded to float32, as torch does with a Python scalar)."""
    return np.multiply(array, np.float32(factor), dtype=np.float32)


def _lerp_(start: np.ndarray, end: np.ndarray, weight: float) -> None:
    """``torch.Tensor.lerp_(end, weight)`` in place on ``start``: torch's two formulas, picked by ``|weight| < 0.5``.

    Usage: ``_lerp_(exp_avg, grad, 1 - beta1)``.
    """
    step = np.subtract(end, start, dtype=np.float32)
    if abs(weight) < 0.5:
        step *= np.float32(weight)
        start += step
    else:
        step *= np.float32(1.0 - weight)
        np.subtract(end, step, out=start)


@dataclass
class Optimizer:
    """Base class: subclasses declare hyperparameters as dataclass fields and implement ``_update``."""

    name: ClassVar[str] = ""
    rescale_grad: float | None = None

    def spec(self) -> dict[str, Any]:
        """The JSON-safe description that travels to the servers."""
        return {"name": self.name, "params": dataclasses.asdict(self)}

    def step(self, sid: SliceId, weight: np.ndarray, grad_sum: np.ndarray, contributor: str = "") -> np.ndarray:
        """Return new weights for ``sid`` (a new array: the old one may still be on the wire).

        ``contributor``: who pushed ``grad_sum`` (one party under MixedSync; "" for a synchronous round).
        ``grad_sum`` may be a read-only view of a received frame: ``_update`` never writes to it.
        """
        scale = 1.0 if self.rescale_grad is None else self.rescale_grad
        w = np.array(weight, dtype=np.float32, copy=True)
        g = np.asarray(grad_sum, dtype=np.float32)
        if scale != 1.0:
            g = _scaled(g, scale)
        self._update(sid, w, g, contributor)
        return w

    def received(self, sid: SliceId, contributor: str, weight: np.ndarray) -> None:
        """``contributor`` now holds ``weight`` for ``sid`` (INIT, a rejoin, a pull). Only DCASGD cares."""

    def _update(self, sid: SliceId, weight: np.ndarray, grad: np.ndarray, contributor: str) -> None:
        """Update ``weight`` (float32, ours) in place from ``grad`` (float32, read only)."""
        raise NotImplementedError

    def state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """The per-slice state as (JSON layout, named arrays), for checkpoints (no pickle).

        Every subclass keeps its state in private dicts (``_momentum``, ``_state`` ...) whose values are
        float32 arrays, lists of ints, or tuples of those; this walks them all. An array is recorded as kind
        "tensor", the name checkpoints of the torch-based optimizers used, so both read each other's files.
        Usage: ``layout, arrays = opt.state()``.
        """
        layout: dict[str, Any] = {}
        arrays: dict[str, np.ndarray] = {}
        for attr, table in vars(self).items():
            if not attr.startswith("_") or not isinstance(table, dict):
                continue
            entries = []
            for index, (held_for, value) in enumerate(table.items()):  # a slice id; DCASGD's: (slice id, contributor)
                leaves = list(value) if isinstance(value, tuple) else [value]
                kinds = []
                for position, leaf in enumerate(leaves):
                    name = f"{attr}/{index}/{position}"
                    if isinstance(leaf, np.ndarray):
                        arrays[name], kind = leaf.copy(), "tensor"
                    elif isinstance(leaf, list):
                        arrays[name], kind = np.asarray(leaf, dtype=np.int64), "ints"
                    else:
                        raise TypeError(f"optimizer {self.name}: cannot save state {attr} of type {type(leaf)}")
                    kinds.append(kind)
                entries.append({"slice": held_for, "leaves": kinds, "tuple": isinstance(value, tuple)})
            layout[attr] = entries
        return layout, arrays

    def load_state(self, layout: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        """Restore what ``state`` returned (ValueError if it does not fit this optimizer)."""
        def as_tuple(raw: Any) -> Any:  # JSON turned the tuples into lists
            return tuple(as_tuple(x) for x in raw) if isinstance(raw, list) else raw

        for attr, entries in layout.items():
            table = getattr(self, attr, None)
            if not attr.startswith("_") or not isinstance(table, dict):
                raise ValueError(f"optimizer {self.name} has no state {attr!r}")
            table.clear()
            for index, entry in enumerate(entries):
                leaves: list[Any] = []
                for position, kind in enumerate(entry["leaves"]):
                    array = arrays[f"{attr}/{index}/{position}"]
                    leaves.append(np.array(array, dtype=np.float32) if kind == "tensor" else [int(x) for x in array])
                held_for = entry["slice"] if "slice" in entry else entry["slot"]  # "slot": an older geomx's checkpoint
                table[as_tuple(held_for)] = tuple(leaves) if entry["tuple"] else leaves[0]


@dataclass
class SGD(Optimizer):
    """SGD with momentum and weight decay, the same arithmetic as ``torch.optim.SGD`` (dampening 0)."""

    name: ClassVar[str] = "sgd"
    lr: float = 0.01
    momentum: float = 0.0
    weight_decay: float = 0.0
    nesterov: bool = False

    def __post_init__(self) -> None:
        self._momentum: dict[SliceId, np.ndarray] = {}

    def _update(self, sid: SliceId, weight: np.ndarray, grad: np.ndarray, contributor: str) -> None:
        if self.weight_decay:  # grad.add(weight, alpha=wd)
            decayed = _scaled(weight, self.weight_decay)
            decayed += grad
            grad = decayed
        if self.momentum:
            buf = self._momentum.get(sid)
            if buf is None:
                buf = self._momentum[sid] = np.array(grad, dtype=np.float32, copy=True)
            else:  # buf.mul_(momentum).add_(grad)
                buf *= np.float32(self.momentum)
                buf += grad
            if self.nesterov:  # grad.add(buf, alpha=momentum)
                ahead = _scaled(buf, self.momentum)
                ahead += grad
                ahead *= np.float32(-self.lr)  # ours: scaled in place (the same float32 product as _scaled's)
                weight += ahead  # weight.add_(grad, alpha=-lr)
                return
            grad = buf
        weight += _scaled(grad, -self.lr)  # weight.add_(grad, alpha=-lr)


@dataclass
class Adam(Optimizer):
    """Adam, the same arithmetic as ``torch.optim.Adam`` (no amsgrad)."""

    name: ClassVar[str] = "adam"
    lr: float = 0.001
    beta1: float = 0.9
    beta2: float = 0.999
    epsilon: float = 1e-8
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        self._state: dict[SliceId, tuple[np.ndarray, np.ndarray, list[int]]] = {}

    def _update(self, sid: SliceId, weight: np.ndarray, grad: np.ndarray, contributor: str) -> None:
        if self.weight_decay:  # grad.add(weight, alpha=wd)
            decayed = _scaled(weight, self.weight_decay)
            decayed += grad
            grad = decayed
        state = self._state.get(sid)
        if state is None:
            state = (np.zeros_like(weight), np.zeros_like(weight), [0])
            self._state[sid] = state
        exp_avg, exp_avg_sq, step = state
        step[0] += 1
        _lerp_(exp_avg, grad, 1 - self.beta1)
        exp_avg_sq *= np.float32(self.beta2)  # exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        scratch = _scaled(grad, 1 - self.beta2)
        scratch *= grad
        exp_avg_sq += scratch
        bias1 = 1 - self.beta1 ** step[0]
        bias2 = 1 - self.beta2 ** step[0]
        denom = np.sqrt(exp_avg_sq)  # (exp_avg_sq.sqrt() / sqrt(bias2)).add_(eps)
        denom /= np.float32(math.sqrt(bias2))
        denom += np.float32(self.epsilon)
        np.multiply(exp_avg, np.float32(-self.lr / bias1), out=scratch)  # addcdiv_: value * exp_avg / denom
        scratch /= denom
        weight += scratch


@dataclass
class OuterNesterov(SGD):
    """DiLoCo's outer optimizer for HFA: Nesterov momentum on the averaged model delta (lr 0.7, momentum 0.9).

    Under HFA the global server feeds it ``-(average delta)`` as the gradient, so plain averaging is
    ``SGD(lr=1.0)`` and this accelerates it.
    """

    name: ClassVar[str] = "outer_nesterov"
    lr: float = 0.7
    momentum: float = 0.9
    nesterov: bool = True


class DelayCompensation:
    """The mechanism of DCASGD and DCAdam (Zheng et al., 2017): a party's gradient was computed on the weights that
    party last received, ``w_bak[party]``, while the server has moved on to ``w``; it is corrected to the server's
    weights with the gradient's diagonal curvature estimate, ``g + lamda * g * g * (w - w_bak[party])``, before the
    optimizer's own rule, and ``w_bak[party]`` becomes the new weights (the party receives them in the reply).

    One backup per (key, slice) *and party*, as in the paper (GeoMX and MXNet keep one per key, and MXNet stores
    the weights *before* the update, which no party ever received). The global server seeds every party's backup
    through ``received`` with what the party got: the initial weights at INIT, the current ones at a rejoin or a
    pull, so a party's first push is compensated too. A push from a party with no backup (no seed: an in-process
    caller) is not compensated. A subclass has a ``lamda`` field and calls ``_backups()`` in ``__post_init__``.
    """

    lamda: float
    _backup: dict[tuple[SliceId, str], np.ndarray]

    def _backups(self) -> None:
        self._backup = {}

    def received(self, sid: SliceId, contributor: str, weight: np.ndarray) -> None:
        """``contributor`` now holds ``weight`` for ``sid``: its next push is compensated against it."""
        self._backup[(sid, contributor)] = np.array(weight, dtype=np.float32, copy=True)

    def compensated(self, sid: SliceId, weight: np.ndarray, grad: np.ndarray, contributor: str) -> np.ndarray:
        """``grad + lamda * grad * grad * (weight - backup)`` (a new array), or ``grad`` itself with no backup."""
        backup = self._backup.get((sid, contributor))
        if backup is None:
            return grad
        direction = _scaled(grad, self.lamda)
        direction *= grad
        direction *= np.subtract(weight, backup, dtype=np.float32)
        direction += grad
        return direction

    def remember(self, sid: SliceId, weight: np.ndarray, contributor: str) -> None:
        """The reply carries ``weight``: the party's next push is compensated against it."""
        self._backup[(sid, contributor)] = weight.copy()


@dataclass
class DCASGD(DelayCompensation, Optimizer):
    """Delay-compensated asynchronous SGD, for MixedSync: MXNet's ``DCASGD.update`` term for term (``g`` is the
    rescaled gradient, ``wd`` stays out of ``g * g``; the compensation: ``DelayCompensation``)::

        v  = momentum * v - lr * (g + wd * w + lamda * g * g * (w - w_bak[party]))   (v starts at 0)
        w  = w + v;  w_bak[party] = w      (the party receives w in the reply)

    Usage: ``kv.set_optimizer(geomx.optim.DCASGD(lr=0.3, lamda=0.04))``.
    """

    name: ClassVar[str] = "dcasgd"
    lr: float = 0.01
    momentum: float = 0.0
    lamda: float = 0.04
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        self._velocity: dict[SliceId, np.ndarray] = {}
        self._backups()

    def _update(self, sid: SliceId, weight: np.ndarray, grad: np.ndarray, contributor: str) -> None:
        direction = self.compensated(sid, weight, grad, contributor)
        if self.weight_decay:  # direction.add(weight, alpha=wd)
            decayed = _scaled(weight, self.weight_decay)
            decayed += direction
            direction = decayed
        step = _scaled(direction, -self.lr)
        if self.momentum:
            velocity = self._velocity.get(sid)
            if velocity is None:
                velocity = self._velocity[sid] = step
            else:  # velocity.mul_(momentum).add_(step)
                velocity *= np.float32(self.momentum)
                velocity += step
            step = velocity
        weight += step
        self.remember(sid, weight, contributor)


@dataclass
class DCAdam(DelayCompensation, Adam):
    """Delay-compensated Adam, for MixedSync: a party's gradient corrected to the server's weights as DCASGD
    corrects it (``DelayCompensation``), then ``torch.optim.Adam``'s step. MixedSync's rows train with Adam on the
    global servers (the workers' Adam translates to it); DCASGD would swap their optimizer for SGD as well as add
    the compensation, so this is the compensation alone on the optimizer they run.

    Usage: ``kv.set_optimizer(geomx.optim.DCAdam(lr=3e-3, lamda=0.04))``.
    """

    name: ClassVar[str] = "dcadam"
    lamda: float = 0.04

    def __post_init__(self) -> None:
        super().__post_init__()
        self._backups()

    def _update(self, sid: SliceId, weight: np.ndarray, grad: np.ndarray, contributor: str) -> None:
        super()._update(sid, weight, self.compensated(sid, weight, grad, contributor), contributor)
        self.remember(sid, weight, contributor)


OPTIMIZERS: dict[str, type[Optimizer]] = {cls.name: cls for cls in (SGD, Adam, DCASGD, DCAdam, OuterNesterov)}


def optimizer_from_spec(spec: Any) -> Optimizer:
    """Rebuild an optimizer from its JSON spec; ValueError names what is wrong."""
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise ValueError("an optimizer spec is {'name': str, 'params': {...}}")
    cls = OPTIMIZERS.get(spec["name"].lower())
    if cls is None:
        raise ValueError(f"unknown optimizer {spec['name']!r}; valid: {sorted(OPTIMIZERS)}")
    params = spec.get("params") or {}
    if not isinstance(params, dict):
        raise ValueError("optimizer params must be an object")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(params) - set(fields)
    if unknown:
        raise ValueError(f"optimizer {cls.name!r} has no parameters {sorted(unknown)}; valid: {sorted(fields)}")
    clean: dict[str, Any] = {}
    for key, value in params.items():
        if value is None and key == "rescale_grad":
            clean[key] = None
        elif isinstance(value, bool):
            clean[key] = value
        elif isinstance(value, (int, float)) and math.isfinite(value):
            clean[key] = float(value)
        else:
            raise ValueError(f"optimizer parameter {key}={value!r} must be a finite number or a boolean")
    return cls(**clean)
