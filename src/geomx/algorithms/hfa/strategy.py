"""HFA's worker side in the PyTorch wrapper: local steps, and every K1 of them the model goes to be averaged.

The worker steps its own optimizer on its own gradients; every ``K1`` steps it pushes each model tensor
divided by its party's worker count and goes on; the average (every K2-th of them the global model, after the
global servers' outer step when one is configured) lands lazily before the forward that needs it. DiLoCo's
outer step and streaming fragments are the servers' part: the worker side is the same for all of them.

Usage::

    strategy = PeriodicAverage(loop)        # K1 from the job's hfa block, or k1=4
    strategy.step()                         # after backward: a local step, a sync every K1
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence

import torch

from ...core.strategy import Loop, WorkerStrategy
from .quorum import decoupled_options
from .rules import streaming_options


class PeriodicAverage(WorkerStrategy):
    """A local optimizer step each step; ``sync`` every ``k1`` of them (``sync`` is what subclasses override)."""

    def __init__(self, loop: Loop, k1: int | None = None) -> None:
        super().__init__(loop)
        self.k1 = k1 if k1 is not None else loop.kv.hfa.k1  # the job's K1 (kv.hfa: the topology's hfa block)
        self.round_steps = self.k1  # local steps in this round (a subclass may assign others)
        self.local_steps = 0
        self.round_started = time.monotonic()

    def init_keys(self) -> None:
        self.round_started = time.monotonic()  # the first round's time counts local steps, not the init wait

    def steps_of(self, rounds: int) -> int | None:
        """K1 steps a local round and K2 local rounds a global one (under streaming: a cycle of every fragment)."""
        return global_round_steps(self.loop, self.k1, rounds)

    def resumes_behind(self) -> bool:
        """Under a quorum below every party the global rounds go on without a slow party: its workers' checkpoints
        may all be of steps before the global servers' checkpoint."""
        topology = self.loop.kv.config.topology
        return 0 < decoupled_options(dict(topology.training.plugin_options)).quorum < len(topology.parties)

    @functools.cached_property
    def common_every(self) -> int | None:
        """The steps of a global round after which every party holds the global model; None: never (streaming, an
        overlapped round or a mix, where each keeps its own part). Read once: ``common_model_step`` asks every step."""
        topology = self.loop.kv.config.topology
        options = dict(topology.training.plugin_options)
        decoupled = decoupled_options(options)  # a quorum below every party: answers land as they arrive
        keeps_own = streaming_options(options).keeps_own_part or 0 < decoupled.quorum < len(topology.parties)
        return None if keeps_own else self.steps_of(1)

    def common_model_step(self) -> int | None:
        """At the start of the step after a global round every party holds the global model (``common_every``)."""
        steps = self.loop.steps_done  # (a job starts, or resumes, at a global round)
        return steps if self.common_every is not None and steps % self.common_every == 0 else None

    def step(self) -> None:
        loop = self.loop
        loop.synchronize()
        self.inner_step()
        self.local_steps += 1
        if self.local_steps % self.round_steps == 0:
            self.sync(finishing=False)
            self.local_steps = 0
            self.round_started = time.monotonic()

    def load_job_model(self, into: Sequence[torch.Tensor]) -> None:
        """Between global rounds a party trains a model of its own: the job's is the global model as this
        party's local server holds it (``kv.pull_job_model``: no WAN; under streaming each fragment's last). This
        worker's answers land first: at a step that ended a global round the server holds that round's model only
        once they are in (without, an evaluation there read that round's model or the one before, by timing).
        Landing them before the next step, not at its start, leaves the training as it was."""
        self.loop.synchronize()
        self.loop.kv.pull_job_model(list(range(len(into))), list(into))

    def sync(self, finishing: bool) -> None:
        """Push every model tensor (its share of the party's average), with the samples the script counted since the
        last sync (``step(tokens=)``), if it counts; the answers land lazily."""
        loop = self.loop
        tokens, loop.tokens = loop.tokens, None
        counted = {} if tokens is None else {"tokens": tokens}
        for key, param in enumerate(loop.params):
            loop.kv.push(key, param.data / loop.kv.num_workers, priority=loop.priority[key], **counted)
        loop.pending.update(range(len(loop.params)))


def global_round_steps(loop: Loop, k1: int, rounds: int) -> int:
    """The steps ``rounds`` global rounds of HFA stand for: K1 x K2 each. Under streaming a slice still goes global
    once every K2 local rounds (its fragment's), so when every slice has completed ``rounds`` global rounds (a
    checkpoint's step: its least advanced slice's) the workers stand at the end of cycle ``rounds``, K1 x K2 x rounds
    steps in. Usage: ``global_round_steps(loop, 4, rounds=3)`` -> 60 with K2 = 5."""
    return rounds * k1 * loop.kv.hfa.k2
