"""``FrozenVarianceAdam``: Adam (or AdamW) whose second moment stops moving after a warm-up: the worker-side half of
training under a sparse WAN codec (Bi-Sparse, MPQ) with Adam.

Why. Under a residual codec each worker steps on the servers' sparse answer: a coordinate's error-feedback residual
leaves about once per ``1 / density`` steps, as the sum of those steps' gradients. Adam divides each burst by the
root of its own running square, so a hundred steps' signal moves the coordinate by one step's length, and the
square itself is fed bursts instead of gradients. Error feedback is only right for an optimizer that is linear in
the gradient (plain SGD: 0.55% from dense at the quality section's budget; Adam: 27.7%). 1-bit Adam's answer (Tang et
al., 2021): Adam's variance settles early; take it from the first ``freeze_after`` steps (while the codec's warm-up,
``warmup_steps``, still sends most of every tensor) and keep it fixed from then on. Past the freeze the step is
``lr * m / (sqrt(v_frozen) + eps)`` with the momentum ``m`` fed the answers: linear in them, so every burst moves a
coordinate by all the steps it stands for. Measured in benchmarks/README.md ("Bi-Sparse under FSA").

One raise keeps the freeze safe: at the first frozen step each tensor's variance is raised to a thousandth of its
mean where it is below (``FLOOR``). A coordinate that the warm-up's gradients hardly touched (a unit seldom active,
a pixel almost always blank, a token not seen yet) would otherwise divide its first real gradient by about ``eps``
(the digits MLP went to nan within 40 steps of a freeze at step 9 without it). Raised once, the variance stays
constant, so the step stays linear in the answers.

Up to ``freeze_after`` steps it is ``torch.optim.Adam`` itself; after, the same arithmetic on the same state
(``exp_avg``, ``exp_avg_sq``, ``step``) with ``exp_avg_sq`` (raised once) and its bias correction held. Each
parameter freezes after its own ``freeze_after`` steps: one whose gradients start later (an unused head, a layer
unfrozen mid-run) takes Adam's steps until then, and never holds the others back. Its ``state_dict`` is Adam's plus
``freeze_after`` in every group, and a checkpoint resumes either phase.

Usage::

    opt = gx.DistributedOptimizer(gx.FrozenVarianceAdam(model.parameters(), lr=3e-3, weight_decay=0.01,
                                                        decoupled_weight_decay=True, freeze_after=120), model)
    # topology: training: {compression: {type: bsc, threshold: 0.01, warmup_steps: 800}}
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch

FLOOR = 1e-3  # of a tensor's mean variance: the least a coordinate's frozen variance may be


class FrozenVarianceAdam(torch.optim.Adam):
    """``torch.optim.Adam`` (AdamW with ``decoupled_weight_decay=True``) whose ``exp_avg_sq`` freezes after
    ``freeze_after`` steps. See the module docstring. No amsgrad (its running maximum is a second moment too)."""

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, *, freeze_after: int,
                 decoupled_weight_decay: bool = False, maximize: bool = False) -> None:
        if isinstance(freeze_after, bool) or not isinstance(freeze_after, int) or freeze_after < 1:
            raise ValueError(f"freeze_after={freeze_after!r}: the steps before the variance freezes, an int >= 1")
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, maximize=maximize,
                         decoupled_weight_decay=decoupled_weight_decay)
        self.defaults["freeze_after"] = freeze_after
        for group in self.param_groups:
            group.setdefault("freeze_after", freeze_after)

    def frozen(self) -> bool:
        """Whether a parameter has taken its group's ``freeze_after`` steps: from then on ``step`` is this class's
        own, each parameter frozen once it has taken them (one without a gradient so far, or whose gradients came
        later, keeps Adam's arithmetic until it has)."""
        return any(state and int(state["step"]) >= group["freeze_after"]
                   for group in self.param_groups for state in (self.state.get(p) for p in group["params"]))

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        if not self.frozen():
            return super().step(closure)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr, eps, decay = float(group["lr"]), group["eps"], group["weight_decay"]
            held = math.sqrt(1 - beta2 ** group["freeze_after"])  # the variance's bias correction, frozen with it
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = -p.grad if group["maximize"] else p.grad
                state = self.state[p]
                if not state:  # its first gradient: Adam's state, as torch.optim.Adam makes it
                    state.update(step=torch.tensor(0.0), exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
                state["step"] += 1
                step = int(state["step"])
                if decay and group["decoupled_weight_decay"]:
                    p.mul_(1 - lr * decay)
                elif decay:
                    grad = grad.add(p, alpha=decay)
                state["exp_avg"].lerp_(grad, 1 - beta1)
                variance, correction = state["exp_avg_sq"], held
                if step <= group["freeze_after"]:  # not frozen yet: Adam's
                    variance.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                    correction = math.sqrt(1 - beta2 ** step)
                elif step == group["freeze_after"] + 1:  # the first frozen step: the floor, once
                    variance.clamp_(min=float(variance.mean()) * FLOOR)
                denom = (variance.sqrt() / correction).add_(eps)
                p.addcdiv_(state["exp_avg"], denom, value=-lr / (1 - beta1 ** step))
        return loss
