"""FSA (``dist_sync``): a round of pushes completes when every awaited client has pushed.

When some clients are missing (dropped as dead, or left), the sum is scaled as if every worker of the job had
sent one like the present ones, so the optimizer's mean (or HFA's weighted average) is over the workers present.

Usage::

    FullySynchronous().round_complete({"a", "b"}, {"a", "b"})     # True
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np

from ...core.policy import SyncPolicy


class FullySynchronous(SyncPolicy):
    """FSA: a round completes when every expected client has contributed."""

    title = "FSA"
    name = "dist_sync"
    synchronous = True
    answers_plain_sums = True

    def round_complete(self, contributors: Collection[str], expected: Collection[str]) -> bool:
        return set(expected) <= set(contributors)

    def rescale(self, total: np.ndarray, present: int, full: int) -> np.ndarray:
        return total if present in (0, full) else total * (full / present)
