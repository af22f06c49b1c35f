"""ESync's state server: local step counts that make every worker reach the aggregation together.

Each worker reports how long one local step takes it. The slowest worker runs ``base_steps`` steps per
round; every other worker runs as many as fit in the same time, so nobody waits and the fast ones
contribute more computation (Li et al., ESync, IEEE TSC 2020). Aggregation itself is HFA's with K2 = 1:
every round the workers' model deltas are averaged (weighted by workers) and scaled by ``global_lr``
(the global server's optimizer ``SGD(lr=global_lr)``).

The reports travel through the server tree as a STATE round (local servers merge their workers'
reports), and the global server answers everyone with the assignment: no extra connection over the WAN.

Usage::

    assign_steps({"dc0/worker0": 0.01, "dc1/worker0": 0.03}, base_steps=2)
    # -> {"dc0/worker0": 6, "dc1/worker0": 2}
"""

from __future__ import annotations

import math
from collections.abc import Mapping

MAX_STEPS = 10_000


def assign_steps(seconds_per_step: Mapping[str, float], base_steps: int) -> dict[str, int]:
    """Local steps per worker for the next round: ``floor(base_steps * slowest / own)``, at least 1."""
    if base_steps < 1:
        raise ValueError(f"base_steps must be at least 1, got {base_steps}")
    if not seconds_per_step:
        return {}
    for name, seconds in seconds_per_step.items():
        if not math.isfinite(seconds) or seconds <= 0:
            raise ValueError(f"worker {name} reported {seconds!r} seconds per step; it must be positive")
    slowest = max(seconds_per_step.values())
    return {name: max(1, min(MAX_STEPS, math.floor(base_steps * slowest / seconds + 1e-9)))
            for name, seconds in seconds_per_step.items()}
