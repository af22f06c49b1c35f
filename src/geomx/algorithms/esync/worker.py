"""ESync's local-step assignment, the worker's half: report the time per local step in a STATE round through
the servers and read this worker's steps from the answer (the servers' half is ``geomx.algorithms.esync.server``,
the rule ``geomx.algorithms.esync.rules.assign_steps``).

Usage::

    steps = StateRoundSteps(context).assign(seconds_per_step=0.02, base_steps=4)
"""

from __future__ import annotations

import math

from ...config import NodeConfig
from ...core.worker_plugins import StepAssigner, WorkerContext
from ...protocol.bodies import decode_body, encode_body
from ...protocol.wire import Message
from .bodies import StateReport, StepAssignment
from .kinds import STATE


class StateRoundSteps(StepAssigner):
    """The slowest worker of the job gets ``base_steps``, the others as many as fit in the same time."""

    def __init__(self, context: WorkerContext) -> None:
        self._context = context

    def assign(self, seconds_per_step: float, base_steps: int) -> int:
        if not math.isfinite(seconds_per_step) or seconds_per_step <= 0:
            raise ValueError(f"seconds_per_step must be positive, got {seconds_per_step}")
        name = self._context.me.name
        ctx = self._context
        report = StateReport({name: float(seconds_per_step)}, int(base_steps))
        future = ctx.requests.call(ctx.servers[0], Message(STATE, body=encode_body(report)))
        reply = ctx.requests.wait(future, ctx.timeout, "the ESync step assignment (all workers of all parties)")
        steps = decode_body(StepAssignment, reply.body).steps
        if name not in steps:
            raise RuntimeError(f"the state server assigned no steps to {name}")
        return int(steps[name])


def state_round_steps_from_config(config: NodeConfig, context: WorkerContext) -> StepAssigner:
    """The step assigner every job serves (the servers always answer STATE rounds)."""
    return StateRoundSteps(context)
