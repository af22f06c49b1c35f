"""The accelerator stand-in: an inner step that waits where a GPU would compute, so that a machine without a GPU
measures what the sync around it costs a real job.

On a GPU an inner step (forward, backward, the party's per-step gradient all-reduce over NVLink, the inner
optimizer) keeps the device busy and leaves the host's CPU free; a wait of the same length does the same to the
host. What leaves the rank must still look like training: the parameters change by a realistic delta (a gradient
computed once from a real batch, times the learning rate and the steps since the last change) before every round
that leaves the rank, so the codecs, servers and links see a real model drifting. Everything after the wait is
real: the LAN tier, the codecs, the servers, the emulated links.

The delta's arithmetic runs on the host's CPU, which a GPU would leave free, so it is spread over the round's
steps: step ``s`` of a round moves the ``s``-th of ``apply_every`` equal parts of the model by ``delta x
apply_every``. At every round's end each part has moved once, and the model is exactly what moving all of it at
the last step would make (nothing reads it in between); no step does more than its share, so on a busy machine
the stand-in takes no burst of CPU from the sync it measures.

Utilization, the share of the wall time the device computes: ``steps * step_s / wall_s``, where ``wall_s``
leaves out the stand-in's own overrun (a delta of 85M parameters takes the CPU longer than a step; a GPU applies
it inside one).

A training loop computes (forward, backward) before it calls the optimizer's step, and the sync runs in that
call: ``compute`` (the wait) and ``move`` (the delta's part, where the optimizer would change the parameters) are
the two halves of ``step`` for a loop shaped that way (``compute`` in the loop, ``move`` as the wrapper's
``inner_step``); ``move``'s CPU time is all overrun, as the device would do it inside its step.

Usage::

    deltas = realistic_deltas(model, loss_fn, lr=1e-4)        # one real forward and backward
    stand_in = StandIn(list(model.parameters()), deltas, step_s=0.040, apply_every=k1)
    opt.strategy.inner_step = stand_in.step                  # the wrapper's seam for the step's own math
    for _ in range(steps): opt.step()                        # no forward, no backward: a wait each
    print(utilization(steps, 0.040, wall_s))
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch


def realistic_deltas(params: Sequence[torch.Tensor], loss: Callable[[], torch.Tensor], lr: float) -> list[torch.Tensor]:
    """``-lr * gradient`` of each parameter, from one real backward of ``loss()`` (SGD's step on that batch).
    The gradients stay in ``.grad``, as in a training loop between backward and the next ``zero_grad``."""
    for param in params:
        param.grad = None
    loss().backward()
    return [torch.zeros_like(p) if p.grad is None else p.grad.detach().mul(-lr) for p in params]


def utilization(steps: int, step_s: float, wall_s: float, overrun_s: float = 0.0) -> float:
    """The share of ``wall_s`` the device computed: ``steps`` inner steps of ``step_s`` each (at most 1).
    ``overrun_s``: the stand-in's own work past its steps' time (``StandIn.overrun_s``: a delta applied on the
    host's CPU, which a GPU does inside its step), left out of the wall time."""
    if wall_s - overrun_s <= 0:
        raise ValueError(f"wall time must be positive, got {wall_s} ({overrun_s} of it the stand-in's overrun)")
    return min(1.0, steps * step_s / (wall_s - overrun_s))


class StandIn:
    """An inner step that takes ``step_s`` of wall time, as the device would. By the end of every ``apply_every``
    steps (a local round, after which something may leave the rank) the parameters have moved by ``deltas`` times
    the round's steps, a part at each of its steps; ``apply_every=None``: they never move."""

    def __init__(self, params: Sequence[torch.Tensor], deltas: Sequence[torch.Tensor], step_s: float,
                 apply_every: int | None, clock: Callable[[], float] = time.perf_counter,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if len(params) != len(deltas):
            raise ValueError(f"{len(params)} parameters but {len(deltas)} deltas")
        if step_s < 0 or (apply_every is not None and apply_every < 1):
            raise ValueError(f"step_s must be >= 0 and apply_every >= 1 (or None), got {step_s} and {apply_every}")
        self.step_s = step_s
        self.apply_every = apply_every
        self.clock = clock
        self.sleep = sleep
        self.steps = 0
        self.overrun_s = 0.0  # steps whose own work (a delta applied) took longer than step_s: the excess
        self.device_s = 0.0  # the sync's device work done on the host (``on_device``): a landing's mix
        self.parts = _parts(list(params), list(deltas), apply_every) if apply_every else []

    @torch.no_grad()
    def step(self) -> None:
        """One inner step: its part of the round's delta, then the wait up to ``step_s`` after the step began."""
        started = self.clock()
        self._move()
        self._wait_until(started + self.step_s)

    def compute(self) -> None:
        """The step's forward and backward, as a loop runs them before the optimizer's step: a wait of ``step_s``."""
        self._wait_until(self.clock() + self.step_s)

    @torch.no_grad()
    def move(self) -> None:
        """The step's change of the parameters (its part of the round's delta), all of its time overrun."""
        started = self.clock()
        self._move()
        self.overrun_s += self.clock() - started

    @property
    def left_out_s(self) -> float:
        """The host's time the device would not spend: the stand-in's overrun and the sync's device work."""
        return self.overrun_s + self.device_s

    def on_device(self, work: Callable[..., None]) -> Callable[..., None]:
        """``work`` timed into ``device_s``: the sync's own device work (a landing's mix into the model), which a
        GPU runs as a kernel between steps in a fraction of a millisecond and the stand-in's host runs as passes
        over memory (25-40 ms for 21M elements on the 2-core machine). Usage:
        ``strategy.mix = stand_in.on_device(strategy.mix)``."""

        def timed(*args: object, **kwargs: object) -> None:
            started = self.clock()
            try:
                work(*args, **kwargs)
            finally:
                self.device_s += self.clock() - started

        return timed

    def _move(self) -> None:
        if self.apply_every:
            for param, delta in self.parts[self.steps % self.apply_every]:
                param.add_(delta, alpha=float(self.apply_every))
        self.steps += 1

    def _wait_until(self, end: float) -> None:
        left = end - self.clock()
        if left < 0:
            self.overrun_s -= left
        while left > 0:
            self.sleep(left)
            left = end - self.clock()


def _parts(params: list[torch.Tensor], deltas: list[torch.Tensor],
           count: int) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """The model cut into ``count`` parts of about equal size (the parameters back to back, flat): each a list of
    (a parameter's range, the same range of its delta), views that write through."""
    flats = [(p.data.view(-1), d.view(-1)) for p, d in zip(params, deltas, strict=True)]
    total = sum(flat.numel() for flat, _ in flats)
    size = -(-total // count)
    parts: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in range(count)]
    at = 0  # where the current parameter starts, in the model's elements
    for flat, delta in flats:
        start = 0
        while start < flat.numel():
            part = (at + start) // size
            stop = min(flat.numel(), (part + 1) * size - at)
            parts[part].append((flat[start:stop], delta[start:stop]))
            start = stop
        at += flat.numel()
    return parts
