"""A worker's digests of its model, for the status page's check that every party holds the same one.

Where the algorithm gives every party the same model after a global round (the sync policy is synchronous and the
worker's strategy says so: ``WorkerStrategy.common_model_step``), a worker digests its model now and then at the
start of a step, once every answer on its way has landed, and its heartbeats carry the last few digests with their
steps (``HeartbeatBody.models``); the global scheduler compares them across parties (``geomx.cluster.digests``).

The digest (``model_digest``) is bit-exact and the same on every device: each tensor's bits, read as integers,
are summed with position weights in 64-bit integer arithmetic (wrapping, so the order of the sum does not matter),
chunk by chunk on the tensor's own device; a few passes over memory, no copy to the host. Parties must digest the
same steps for the scheduler to compare them: each digests the multiples of a power of two (``period``) that keeps
it at about one digest per heartbeat interval and under 2% of its time, so that a party whose period is twice
another's digests a subset of the other's steps.

Usage (the wrapper's ``step()``, before the strategy's)::

    digests = ModelDigests.of(opt, interval_s=1.0)     # None where parties hold models of their own
    digests.before_step()
    digests.at_close()                                 # the final model, in close()
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..algorithms.registry import SYNC_POLICIES

MASK = (1 << 64) - 1
COLUMNS = 4096  # a chunk's row length: the column weights are this long
CHUNK = COLUMNS * 1024  # elements summed at once (bounds the temporaries: 32 MiB of int64 each)
KEEP = 8  # digests a heartbeat carries
BUDGET = 0.02  # the share of a worker's time digests may take
_INTS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_ODD = 0x9E3779B1  # position weights: an odd multiplier spreads neighbouring positions apart


def _fold(tensor: torch.Tensor) -> int:
    """``tensor``'s bits as integers, summed with position weights, modulo 2**64."""
    flat = tensor.detach().contiguous().reshape(-1)
    size = flat.element_size()
    bits = flat.view(_INTS[size]) if size in _INTS else flat.view(torch.uint8)
    device = bits.device
    columns = torch.arange(1, COLUMNS + 1, dtype=torch.int64, device=device) * _ODD  # (4096 elements: cheap)
    total = 0
    for start in range(0, bits.numel(), CHUNK):
        chunk = bits[start:start + CHUNK].to(torch.int64)
        rows, tail = divmod(chunk.numel(), COLUMNS)
        first = start // COLUMNS + 1
        if rows:
            sums = (chunk[:rows * COLUMNS].view(rows, COLUMNS) * columns).sum(dim=1)
            total += int((sums * torch.arange(first, first + rows, dtype=torch.int64, device=device)).sum())
        if tail:
            total += int((chunk[rows * COLUMNS:] * columns[:tail]).sum()) * (first + rows)
    return total & MASK


def model_digest(tensors: Sequence[torch.Tensor]) -> str:
    """A 16-hex-digit fingerprint of ``tensors``' bits, in their order: equal for bit-equal tensors on any device.
    Usage: ``model_digest([p.data for p in model.parameters()])``"""
    total = 0
    for index, tensor in enumerate(tensors):
        total = (total * 1_000_003 + _fold(tensor) + index * _ODD + tensor.numel()) & MASK
    return f"{total:016x}"


class ModelDigests:
    """When to digest the model and what the heartbeats carry (see the module docstring)."""

    def __init__(self, loop: Any, step_of: Callable[[], int | None], note: Callable[[dict[str, str]], None],
                 interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._loop = loop  # the wrapper: its params, steps_done and synchronize()
        self._step_of = step_of  # the step whose model every party holds now, or None
        self._note = note
        self._interval_s = interval_s
        self._clock = clock
        self.period = 1  # digest the steps that are multiples of this (a power of two)
        self.recent: dict[str, str] = {}
        self._last: float | None = None
        self._step_s = 0.0  # a step's time, a moving average
        self._cost_s = 0.0  # the last digest's time

    @classmethod
    def of(cls, opt: Any, interval_s: float) -> ModelDigests | None:
        """The wrapper's digests, or None where the job's parties need not hold the same model."""
        policy = SYNC_POLICIES.get(opt.plan.kvstore_type)
        if policy is None or not policy.synchronous or opt.strategy.common_model_step() is None:
            return None
        return cls(opt, opt.strategy.common_model_step, lambda models: opt.kv.pulse.note(models=models), interval_s)

    def before_step(self) -> None:
        """At the start of ``step()``: digest the model if this step is one to digest."""
        now = self._clock()
        if self._last is not None:
            spent = now - self._last
            self._step_s = spent if self._step_s == 0 else 0.9 * self._step_s + 0.1 * spent
            wanted = max(self._interval_s, self._cost_s / BUDGET)
            self.period = 1 << max(0, int(wanted / self._step_s).bit_length() - 1) if self._step_s > 0 else 1
        self._last = now
        step = self._step_of()
        if step is None or step % self.period:
            return
        self._take(step)

    def at_close(self) -> None:
        """At the end of training (the wrapper's ``close()``, once the last updates landed): digest the final model
        whatever the period, where every party holds it. Every party ends at the same step, so the job's last
        model is always compared, however few steps it ran or however the parties' periods differ."""
        step = self._step_of()
        if step is not None and str(step) not in self.recent:
            self._take(step)

    def _take(self, step: int) -> None:
        """Digest the model at ``step`` once every answer on its way has landed and tell the heartbeats."""
        self._loop.synchronize()
        started = self._clock()
        self.recent[str(step)] = model_digest([p.data for p in self._loop.params])
        while len(self.recent) > KEEP:
            del self.recent[min(self.recent, key=int)]
        self._note(dict(self.recent))
        self._cost_s = self._clock() - started
        if self._last is not None:
            self._last += self._cost_s  # its own time is not a step's
