"""What a DDP user's loop may do that the wrapper cannot carry out as written: named, never silently wrong.

- A gradient changed between backward and ``step()`` (clipped, scaled, replaced) after backward's hook sent it:
  the algorithm applies what was sent, so the change would be lost. The gradient's version counter (every in-place
  change bumps it) and identity, recorded when the hook sent it, tell (``changed``); ``changed_refusal`` says why
  and the fix for the plan.
- With the optimizer state on the global servers the wrapped optimizer's ``state_dict()`` is empty:
  ``state_elsewhere`` says where the state lives, for the wrapper's ``state_dict`` to carry.

Usage (the wrapper's)::

    opt._sent[key] = (param.grad, param.grad._version)       # from backward's hook, once sent
    refuse_changed(opt, "step()")                             # at step(): RuntimeError if any .grad changed since
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from .plan import Plan, Strategy


def refuse_changed(opt: Any, call: str) -> None:
    """RuntimeError if a gradient that backward's hook of ``opt`` (the wrapper) sent has changed since (clipped,
    scaled or replaced before ``call``), naming it and the fix; the record is cleared either way."""
    keys = changed(opt._sent, opt.params)
    opt._sent.clear()
    if keys:
        raise RuntimeError(changed_refusal(opt.kv.name, [opt.names[k] for k in keys], opt.plan.mode, call))


def changed(sent: Mapping[int, tuple[torch.Tensor, int]], params: Sequence[torch.Tensor]) -> list[int]:
    """The keys of ``sent`` (key -> the ``.grad`` sent and its version then) whose ``.grad`` is another tensor now,
    or the same one changed in place."""
    return [key for key, (grad, version) in sent.items() if params[key].grad is not grad or grad._version != version]


def changed_refusal(worker: str, names: Sequence[str], mode: Strategy, call: str) -> str:
    """Why gradients ``names`` (changed before ``call``) cannot be applied as they are, and the fix under ``mode``."""
    which = repr(names[0]) + (f" and {len(names) - 1} more" if len(names) > 1 else "")
    if mode is Strategy.SERVER:
        why = ("to the global servers, which run the optimizer on them as sent: the change (a clip, a scaling) would "
               "be lost. Set training.server_optimizer: none (the optimizer on every worker) and call "
               "opt.average_gradients() before changing the gradients, or use HFA")
    else:
        why = ("to be averaged: step() would apply the average of what was sent, and the change (a clip, a scaling) "
               "would be lost. Call opt.average_gradients() after backward and before changing the gradients: it "
               "makes every .grad the gradient step() applies, as DDP leaves it after backward")
    return (f"{worker}: the gradient of {which} changed between backward and {call}, after backward's hooks had "
            f"sent it {why}")


def state_elsewhere(plan: Plan) -> str | None:
    """Where the optimizer state lives when it is not (all) in the wrapped optimizer, in words; None if it is."""
    server = plan.server_optimizer
    if server is None:
        return None
    checkpoint = ("the job's checkpoints hold it (checkpoint: {dir: ..., every_steps: N} in the topology; "
                  "geomx launch --resume)")
    if plan.mode is Strategy.SERVER:
        return (f"the optimizer state is on the global servers ({server.name}, which run the optimizer), not in this "
                f"dict, whose 'state' stays empty (the wrapped optimizer never steps here): {checkpoint}")
    return (f"this dict holds the inner optimizer's state; the outer optimizer's ({server.name}) is on the global "
            f"servers: {checkpoint}")
