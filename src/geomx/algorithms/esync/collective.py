"""ESync in a ``lan: collective`` party: the party is one worker of ESync. Its ranks train data-parallel inside
(collective HFA's inner steps) and go global together after the steps the state server assigned the party, from
the time its rank 0 measured per step (a rank that waits in the all-reduce for a slower one measures the
party's pace).

What travels is what a server party's workers and local server send, so a job may mix both kinds of party:
every round the model's global round (HFA with K2 = 1), then the end-of-data flag, as a control slice: the
party's mean flag (1 on a rank whose data ended) goes up as a delta by the slice's owner, like any slice, and a
positive global value means some worker's data ended, so that round was the job's last; otherwise rank 0 asks
the state server for the party's steps of the next round (``kv.assign_local_steps``) and tells the other ranks.

Usage (chosen by the wrapper for a collective party under ESync)::

    strategy = CollectiveESync(loop)
    strategy.step()                 # after backward: the party's inner step; a global round when its steps are done
"""

from __future__ import annotations

import time

import torch

from ...collective.owners import OwnedSlice
from ...core.strategy import Loop
from ..hfa.collective import CollectivePeriodicAverage
from .strategy import CONTROL_KEY


class CollectiveESync(CollectivePeriodicAverage):
    """Collective HFA with K2 = 1, the party's local steps per round assigned by its measured speed."""

    def __init__(self, loop: Loop) -> None:
        super().__init__(loop)
        self.round_steps = self.k1  # the party's steps this round (the first: K1, as every worker's)
        self.steps_in_round = 0
        self.round_started = time.monotonic()
        self.done = False  # some worker's data ended and its round is over: the job's last
        self.control = OwnedSlice(CONTROL_KEY, 0, 1, 0, 1)
        self.control_global = torch.zeros(1)  # the flag's global value, as of the last round
        self.rounds = 0  # the party's global rounds so far (K2 = 1: each of its rounds)

    def init_keys(self) -> None:
        super().init_keys()
        kv = self.loop.kv
        kv.init(CONTROL_KEY, self.control_global)  # the master's zero; its owner INITs it for the party
        if self.loop.ranks.owns(CONTROL_KEY, 0):
            self.rules.set_global_model(self.control.id, self.control_global.numpy())  # a view: kept current
        self.round_started = time.monotonic()  # the first round's time counts local steps, not the init

    def steps_of(self, rounds: int) -> int | None:
        return None  # the party's steps per round are assigned by its speed: rounds tell no step

    def checkpoint_number(self, step: int) -> int | None:
        """The global rounds completed once this step's round is, if ``step`` ends one (checkpoints go by rounds)."""
        return self.rounds + 1 if self.steps_in_round + 1 == self.round_steps else None

    def step(self) -> None:
        if self.done:
            self.loop.warn_once("esync", "ESync: a worker ran out of data and the job's last round is over; "
                                         "the remaining steps of this loop do not train")
            return
        self.inner_step()
        self.steps_in_round += 1
        if self.steps_in_round == self.round_steps:
            self._end_round(finishing=False)

    def _end_round(self, finishing: bool) -> None:
        """The party's global round, then the end-of-data flag; the next round's steps unless it was the last."""
        loop = self.loop
        ranks = loop.ranks
        per_step = (time.monotonic() - self.round_started) / max(self.steps_in_round, 1)
        self.sync()  # the model's global round (K2 = 1: every local round is one)
        self.rounds += 1
        started = time.monotonic()
        flag = torch.full((1,), (1.0 if finishing else 0.0) / ranks.group.world_size)
        ranks.group.all_reduce(flag)  # the party's mean flag, as a local server sums its workers' pushes
        owner = ranks.owner(CONTROL_KEY, 0)
        if ranks.rank == owner:
            delta = self.rules.after_local_round(self.control.id, flag.numpy())
            assert delta is not None, "K2 = 1: every local round is global"
            piece = torch.from_numpy(delta)
            ranks.exchange([(self.control, piece)], loop.priority, kind="delta", bases=[self.control_global])
            self.control_global.copy_(piece)
        ranks.group.broadcast(self.control_global, source=owner)
        if float(self.control_global[0]) > 0:
            self.done = True
        else:
            self.round_steps = loop.kv.assign_local_steps(per_step, base_steps=self.k1)
        loop.waited(time.monotonic() - started)
        self.steps_in_round = 0
        self.round_started = time.monotonic()

    def finish(self) -> None:
        """The loop ended: this party's data did, so its round (however many steps it took) is the job's last."""
        if not self.done:
            self._end_round(finishing=True)
        super().finish()
