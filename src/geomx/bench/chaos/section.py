"""The chaos section's entry points: the scenarios by name, ``measure`` (chosen ones at a plan) and ``run``
(``geomx bench --only chaos``: every one, at ``QUICK`` or ``FULL``).

Usage::

    section = measure(("rank_lost",), QUICK, Path("bench-results"))
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..jobs import load_avg
from ..quality import Command, python_command
from ..sections import BenchPlan, Interrupted
from ..tables import say
from .lost import party_lost, rank_lost
from .plan import FULL, QUICK, ChaosPlan
from .restart import global_restart
from .slow import slow_party

SCENARIOS = {"slow_party": slow_party, "party_lost": party_lost, "rank_lost": rank_lost,
             "global_restart": global_restart}


def measure(names: tuple[str, ...], plan: ChaosPlan, out_dir: Path,
            command: Command = python_command) -> dict[str, Any]:
    """Run the named scenarios at ``plan``; the section's dict (``run``'s). ``command(script, args)``: how a job's
    workers start the worker script (a test forks them warm; torchrun's ranks always start cold)."""
    unknown = sorted(set(names) - set(SCENARIOS))
    if unknown:
        raise ValueError(f"unknown chaos scenarios {unknown}; valid: {', '.join(SCENARIOS)}")
    out_dir.mkdir(parents=True, exist_ok=True)
    section: dict[str, Any] = {"plan": asdict(plan), "records": {}, "errors": [], "load_avg_start": load_avg()}
    try:
        for name in names:
            say(f"[chaos] {name} ...")
            try:
                section["records"][name] = SCENARIOS[name](plan, out_dir, command)
            except RuntimeError as exc:
                section["errors"].append(f"{name}: {exc}")
                say(f"[chaos] {name} FAILED: {exc}")
    except KeyboardInterrupt:
        section["interrupted"] = True
        raise Interrupted(section) from None
    section["load_avg_end"] = load_avg()
    return section


def run(plan: BenchPlan, out_dir: Path) -> dict[str, Any]:
    """The section's entry point: every scenario, at ``QUICK`` or ``FULL``."""
    return measure(tuple(SCENARIOS), QUICK if plan.quick else FULL, out_dir)
