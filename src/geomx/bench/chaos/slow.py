"""The ``slow_party`` scenario: dc2's steps 3x slower, with decoupled rounds (quorum 2), synchronous rounds, and
dc0 and dc1 alone (the package's face says what is measured).

Usage::

    record = slow_party(ChaosPlan(steps=40), Path("out"))
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..quality import Command, python_command
from .plan import PARTIES, SLOW, ChaosPlan, run_variant, topology


def variant(name: str, plan: ChaosPlan, parties: tuple[str, ...], quorum: int | None, slow: bool, out_dir: Path,
            command: Command) -> dict[str, Any]:
    """One of the three jobs: ``parties``, a quorum or none, dc2 slowed or not."""
    slow_rank = parties.index(SLOW) if slow else -1
    extra = ["--slow-steps", str(plan.slow_steps)] if slow and quorum is not None else []  # decoupled: dc2's own
    return run_variant(name, plan, topology(plan, parties, quorum), slow_rank, extra, out_dir, command)


def slow_party(plan: ChaosPlan, out_dir: Path, command: Command = python_command) -> dict[str, Any]:
    """The ``slow_party`` record (see the package's face)."""
    runs = {"decoupled": variant("slow-decoupled", plan, PARTIES, 2, True, out_dir, command),
            "synchronous": variant("slow-synchronous", plan, PARTIES, None, True, out_dir, command),
            "alone": variant("slow-alone", plan, PARTIES[:2], None, False, out_dir, command)}
    base = runs["alone"]["steps_per_s"]
    return {"scenario": "slow_party", "goodput": runs["decoupled"]["steps_per_s"] / base,
            "goodput_synchronous": runs["synchronous"]["steps_per_s"] / base, "runs": runs,
            "goal": {"goodput": 0.85}}
