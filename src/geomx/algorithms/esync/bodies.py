"""ESync's message bodies: what a STATE request and its answer carry as JSON (``geomx.protocol.bodies`` encodes
and checks them; the protocol layer knows no algorithm).

Usage::

    message = Message(STATE, body=encode_body(StateReport({"dc0/worker0": 0.02}, base_steps=4)))
    steps = decode_body(StepAssignment, reply.body).steps      # BodyError if a key is missing or mistyped
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StateReport:
    """STATE, worker -> servers: seconds per local step by worker name, and the slowest worker's steps."""

    seconds_per_step: dict[str, float]
    base_steps: int


@dataclass(frozen=True)
class StepAssignment:
    """STATE's answer: local steps per worker name for the next round."""

    steps: dict[str, int]
