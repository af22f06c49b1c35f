"""``torch.amp.GradScaler`` under the wrapper: the scaler checks and unscales the gradients the step applies, and
every worker skips the same steps.

A scaler multiplies the loss, so backward's gradients (the ones geomx pushes) are scaled; before the step it
unscales them and skips the update if any is not finite. Under DDP every rank holds the averaged gradients by then,
so every rank finds the same and their scales stay equal. Under geomx the script calls ``opt.average_gradients()``
first (as for clipping, or Horovod's ``synchronize()``), then ``scaler.step(opt)``: the wrapper declares
``_step_supports_amp_scaling``, so the scaler calls ``opt.step()`` every time, with ``grad_scale`` and ``found_inf``
set, and the wrapper unscales (unless ``scaler.unscale_(opt)`` did) and skips the wrapped optimizer's update on
``found_inf``, while the algorithm's schedule goes on (HFA's local and global rounds stay on their steps).

Usage (the script's loop)::

    scaler.scale(loss).backward()
    opt.average_gradients()      # every .grad: the mean the step applies, still scaled
    scaler.step(opt)             # unscaled here; the update skipped on inf or NaN, on every worker alike
    scaler.update()
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch


def grad_scaler_skips(attributes: Mapping[str, Any], grads: Iterable[torch.Tensor], averaged: bool) -> bool:
    """Whether this step's update is skipped: ``attributes`` are the wrapper's own (a scaler's ``found_inf`` and
    ``grad_scale`` for the call, if a scaler calls); ``grads`` are unscaled in place by ``grad_scale`` when it is
    set (``scaler.unscale_(opt)`` leaves it unset: the gradients are unscaled already), and only read then, so a
    step without a scaler may pass a generator that is never run. RuntimeError where the script did not call
    ``average_gradients`` first."""
    found_inf = attributes.get("found_inf")
    if found_inf is None:  # no scaler
        return False
    if not averaged:
        raise RuntimeError("torch.amp.GradScaler: call opt.average_gradients() after backward and before "
                           "scaler.unscale_(opt) or scaler.step(opt), so that the scaler checks and unscales the "
                           "gradients the step applies, the same on every worker")
    scale = attributes.get("grad_scale")
    if scale is not None:
        inverse = scale.double().reciprocal().float()  # GradScaler's own: a power of two, so the product is exact
        for grad in grads:
            grad.mul_(inverse.to(grad.device))
    return bool(found_inf.item() > 0)
