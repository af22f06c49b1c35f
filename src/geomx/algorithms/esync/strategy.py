"""ESync's worker side in the PyTorch wrapper: HFA's periodic average, with the steps per round assigned by
measured speed and an end-of-data protocol.

Each round's sync also pushes a control flag (1 / workers when this worker's data is exhausted, else 0) and
pulls the party's sum of it: a positive sum means some worker is done, so the job's last round is over and
every worker stops training (steps after it only warn). Otherwise the worker reports its time per step and
gets its local step count for the next round (``kv.assign_local_steps``: the servers' state rounds).

Usage::

    strategy = ESync(loop)
    strategy.init_keys()                    # the control key
    strategy.step()                         # a local step; a sync when this round's assigned steps are done
"""

from __future__ import annotations

import time

import torch

from ...core.strategy import WRAPPER_KEYS, Loop
from ..hfa.strategy import PeriodicAverage

CONTROL_KEY = WRAPPER_KEYS + 1  # the end-of-data flag, summed over the party's workers


class ESync(PeriodicAverage):
    """HFA with K2 = 1, local steps assigned per worker by speed, and the end-of-data flag at every sync."""

    def __init__(self, loop: Loop, k1: int | None = None) -> None:
        super().__init__(loop, k1)
        self.done = False  # a worker ran out of data: the job's last round is over
        self.rounds = 0  # global rounds this worker took part in (K2 = 1: each of its syncs)

    def steps_of(self, rounds: int) -> int | None:
        return None  # each worker's local steps per round are assigned by its speed: rounds tell no step

    def checkpoint_number(self, step: int) -> int | None:
        """The global rounds completed once this step's round is, if ``step`` ends one (checkpoints go by rounds)."""
        return self.rounds + 1 if self.local_steps + 1 == self.round_steps else None

    def init_keys(self) -> None:
        self.loop.kv.init(CONTROL_KEY, torch.zeros(1))
        super().init_keys()

    def step(self) -> None:
        if self.done:
            self.loop.warn_once("esync", "ESync: a worker ran out of data and the job's last round is over; "
                                         "the remaining steps of this loop do not train")
            return
        super().step()

    def sync(self, finishing: bool) -> None:
        loop = self.loop
        per_step = (time.monotonic() - self.round_started) / max(self.round_steps, 1)
        super().sync(finishing)
        self.rounds += 1
        loop.kv.push(CONTROL_KEY, torch.full((1,), (1.0 if finishing else 0.0) / loop.kv.num_workers), priority=1)
        started = time.monotonic()
        control = torch.zeros(1)
        loop.kv.pull(CONTROL_KEY, control, priority=1)
        if float(control[0]) > 0:
            self.done = True
        else:
            self.round_steps = loop.kv.assign_local_steps(per_step, base_steps=self.k1)
        loop.waited(time.monotonic() - started)

    def finish(self) -> None:
        if not self.done:
            self.sync(finishing=True)
