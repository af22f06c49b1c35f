"""Which way the wrapped training loop runs, decided once from the configuration and the torch optimizer.

The loop never changes; the topology's ``training`` block (or GEOMX_* variables) and ``hfa`` decide the
mode (``Strategy``, in ``geomx.algorithms.modes`` so that the registry keys the wrapper's strategies by it):

- ``SERVER``: MixedSync, SSP, DCASGD, or FSA with ``server_optimizer: translate`` or a named one. Workers push
  gradients, the global servers run the optimizer (the wrapped torch optimizer translated, or the configured
  server optimizer), workers pull weights.
- ``LOCAL``: FSA's default without P3 (``server_optimizer: auto``), as DDP: workers push gradients, pull
  their sum, and the wrapped torch optimizer steps on the mean on every worker (any torch optimizer; needed by
  residual codecs such as bsc; the global server's answer stays a plain sum, so the last party may get it
  early). With P3 ``auto`` translates the optimizer onto the servers: P3's overlap lands new weights lazily.
- ``HFA``: local optimizer steps; every K1 steps the model is averaged (K2 local averages per global one).
- ``ESYNC``: HFA with K2 = 1 and the local step count per round assigned by measured speed.

Usage::

    plan = make_plan(topology.training, topology.hfa, torch.optim.Adam(model.parameters(), lr=1e-3))
    plan.mode, plan.server_optimizer          # Strategy.SERVER, geomx.optim.Adam(lr=0.001, ...)
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from .. import optim
from ..algorithms.modes import Strategy
from ..algorithms.registry import SYNC_POLICIES, SYNCHRONOUS, check_names
from ..codecs import CodecError, idle_size_gate, make_codec
from ..config import ConfigError, HFASpec, NodeConfig, TrainingSpec
from ..config.combinations import check, check_training
from .frozen_variance import FrozenVarianceAdam

log = logging.getLogger("geomx.torch")

# training.server_optimizer values that name no server optimizer: the wrapper decides (auto), the wrapped
# optimizer steps on every worker (none), or it is translated onto the global servers (translate)
WRAPPER_CHOICES = ("auto", "none", "translate")


def keeps_residuals(compression: Mapping[str, Any] | None) -> bool:
    """Whether the codec ``compression`` names keeps residuals across rounds (the codec registry says:
    Bi-Sparse, MPQ, anything wrapped in error feedback): it needs additive data (gradients or deltas), never
    weights. A spec the registry refuses counts as False here; its error is reported where the codec is built.

    Usage: ``keeps_residuals({"type": "bsc", "ratio": 0.01})`` -> True
    """
    if not compression:
        return False
    try:
        return make_codec(compression).keeps_residual()
    except CodecError:
        return False


@dataclass(frozen=True)
class Plan:
    """What DistributedOptimizer does: the mode, the kvstore type, what the master installs on the servers."""

    mode: Strategy
    kvstore_type: str
    server_optimizer: optim.Optimizer | None
    compression: dict[str, Any] | None
    p3: bool

    def describe(self) -> str:
        parts = [self.mode.value, self.kvstore_type]
        if self.server_optimizer is not None:
            parts.append(f"server optimizer {self.server_optimizer.name}")
        if self.compression:
            parts.append(f"WAN codec {self.compression['type']}")
        if self.p3:
            parts.append("P3")
        return ", ".join(parts)


def translate(torch_optimizer: torch.optim.Optimizer) -> optim.Optimizer | None:
    """The geomx server optimizer doing the same arithmetic as ``torch_optimizer``; None if there is none.

    Translatable: ``torch.optim.SGD`` (no dampening) and ``torch.optim.Adam`` (no amsgrad), one set of
    hyperparameters for every parameter group.
    """
    groups = torch_optimizer.param_groups
    if not groups:
        return None
    ignore = {"params", "name", "initial_lr"}
    first = {k: v for k, v in groups[0].items() if k not in ignore}
    if any({k: v for k, v in g.items() if k not in ignore} != first for g in groups[1:]):
        return None
    lr = first.get("lr")
    if not isinstance(lr, (int, float)):  # a tensor learning rate cannot travel as a number
        return None
    if type(torch_optimizer) is torch.optim.SGD:
        if first.get("dampening", 0) or first.get("maximize"):
            return None
        return optim.SGD(lr=float(lr), momentum=float(first.get("momentum", 0.0)),
                         weight_decay=float(first.get("weight_decay", 0.0)), nesterov=bool(first.get("nesterov")))
    if type(torch_optimizer) is torch.optim.Adam:
        if first.get("amsgrad") or first.get("maximize") or first.get("decoupled_weight_decay"):
            return None
        beta1, beta2 = first.get("betas", (0.9, 0.999))
        return optim.Adam(lr=float(lr), beta1=float(beta1), beta2=float(beta2), epsilon=float(first.get("eps", 1e-8)),
                          weight_decay=float(first.get("weight_decay", 0.0)))
    return None


def _named_optimizer(spec: TrainingSpec, torch_optimizer: torch.optim.Optimizer) -> optim.Optimizer:
    """The configured server optimizer; its lr defaults to the torch optimizer's (except the outer one)."""
    cls = optim.OPTIMIZERS[spec.server_optimizer]
    params: dict[str, Any] = dict(spec.server_optimizer_params)
    lr = torch_optimizer.param_groups[0].get("lr") if torch_optimizer.param_groups else None
    if "lr" not in params and cls is not optim.OuterNesterov and isinstance(lr, (int, float)):
        params["lr"] = float(lr)
    try:
        return optim.optimizer_from_spec({"name": cls.name, "params": params})
    except ValueError as exc:
        raise ConfigError(f"training.server_optimizer: {exc}") from None


def leads_party(config: NodeConfig) -> bool:
    """Whether this worker speaks for its party in warnings: the party's first rank (or the job's master worker), so
    a job of N workers says a thing once per party, not N times."""
    rank = config.torchrun.rank if config.torchrun is not None else config.rank
    return config.is_master or rank in (None, 0)


def trained_sizes(torch_optimizer: torch.optim.Optimizer) -> list[int]:
    """The elements of each tensor ``torch_optimizer`` trains: what the WAN codec's size gate compares."""
    return [p.numel() for group in torch_optimizer.param_groups for p in group["params"] if p.requires_grad]


def _why_none(spec: TrainingSpec, residual: bool, codec: object, torch_optimizer: torch.optim.Optimizer) -> str:
    """Why no server optimizer came of ``spec``, in the words of the refusal a policy that needs one gives (each
    cause its own way out: the user's ``none``, a residual codec, an optimizer without a server twin)."""
    if spec.server_optimizer == "none":
        return "training.server_optimizer is none: set it (e.g. sgd, adam or dcasgd)"
    if residual and spec.server_optimizer == "auto":
        return (f"codec {codec!r} keeps residuals, which need additive answers, not a server optimizer's weights: "
                "use a codec without residuals (fp16, bf16, int8) or training.sync dist_sync")
    return (f"{type(torch_optimizer).__name__} with these settings cannot be translated (SGD and Adam can): set "
            "training.server_optimizer (e.g. sgd, adam or dcasgd)")


def make_plan(spec: TrainingSpec, hfa: HFASpec | None, torch_optimizer: torch.optim.Optimizer,
              warn: bool = True, size_lower_bound: int | None = None) -> Plan:
    """Decide the mode; ConfigError names an unknown name or any combination that cannot work. ``warn``: log
    what works but costs (a worker that does not lead its party stays quiet: ``leads_party``). ``size_lower_bound``
    (the topology's): where a codec's size gate (bsc, mpq) passes none of the optimizer's tensors, say so, and warn
    of nothing that sparse answers would cost (None: the tensors are not checked)."""
    idle = None if size_lower_bound is None or not spec.compression else \
        idle_size_gate(spec.compression, size_lower_bound, trained_sizes(torch_optimizer))
    plan = _decide(spec, hfa, torch_optimizer, warn and idle is None)
    if warn and idle is not None:  # after the checks: a refused combination is said alone
        log.warning("%s", idle)
    return plan


def _decide(spec: TrainingSpec, hfa: HFASpec | None, torch_optimizer: torch.optim.Optimizer, warn: bool) -> Plan:
    """``make_plan``'s decision; ``warn``: log what sparse answers cost the torch optimizer."""
    check_names(spec)
    codec = spec.compression["type"] if spec.compression else None
    residual = keeps_residuals(spec.compression)
    named = spec.server_optimizer not in WRAPPER_CHOICES
    policy = SYNC_POLICIES[spec.sync]  # check_names refused a name the registry does not hold
    # (geomx launch checked these rows before any process started; a rank started by hand is checked here)
    facts = check_training(spec, hfa, synchronous=SYNCHRONOUS, applies_on_server=policy.needs_server_optimizer,
                           residual_codec=residual)
    if hfa is not None:
        outer = _named_optimizer(spec, torch_optimizer) if named else None
        return Plan(Strategy.ESYNC if spec.esync else Strategy.HFA, spec.sync, outer, spec.compression, spec.p3)
    # auto: on the servers where the policy needs it (answers may be models the party's own push is not in
    # yet) or where P3 is on (answers that are weights land lazily, before the forward that needs them: P3's
    # overlap); otherwise every worker steps on the mean gradient, as DDP does, and the global server's answer
    # stays the plain sum, which lets it answer the last party early (benchmarks/README.md, "Loop shapes")
    on_servers = policy.needs_server_optimizer or spec.p3
    if named:
        server: optim.Optimizer | None = _named_optimizer(spec, torch_optimizer)
    elif spec.server_optimizer == "translate" or (spec.server_optimizer == "auto" and not residual and on_servers):
        server = translate(torch_optimizer)
        if server is None and spec.server_optimizer == "translate":
            raise ConfigError(f"training.server_optimizer translate: {type(torch_optimizer).__name__} has no server "
                              "twin (SGD without dampening, Adam without amsgrad, one set of hyperparameters)")
    else:
        server = None
    check({**facts, "server_optimizer": server is not None, "no_server_optimizer": server is None},
          codec=codec, policy=policy.title, sync=spec.sync, why=_why_none(spec, residual, codec, torch_optimizer))
    if server is None:
        if warn and residual and isinstance(torch_optimizer, torch.optim.Adam) \
                and not isinstance(torch_optimizer, FrozenVarianceAdam):
            log.warning("%s on %s's sparse answers: Adam shortens each coordinate's burst of residual to one step "
                        "(27.7%% higher loss in the quality bench); geomx.torch.FrozenVarianceAdam with the codec's "
                        "warmup_steps recovers most of it (docs/compression.md)", type(torch_optimizer).__name__, codec)
        if spec.server_optimizer == "auto" and not residual and on_servers:
            log.info("%s has no server equivalent: gradients are averaged and it steps on every worker",
                     type(torch_optimizer).__name__)
        return Plan(Strategy.LOCAL, spec.sync, None, spec.compression, spec.p3)
    return Plan(Strategy.SERVER, spec.sync, server, spec.compression, spec.p3)
