"""MixedSync's global tier (``dist_async``): every push is its own round, applied and answered on arrival.

Each party's push is applied alone and unscaled, and a party may leave while the others still push.

Usage::

    Asynchronous().round_complete({"a"}, {"a", "b"})     # True
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np

from ...core.policy import SyncPolicy


class Asynchronous(SyncPolicy):
    """MixedSync's global tier: every push is its own round, applied and answered on arrival."""

    title = "MixedSync"
    name = "dist_async"
    clients_leave_independently = True
    needs_server_optimizer = True
    counts_staleness = True  # a push is applied on whatever the others pushed since its party's last answer

    def round_complete(self, contributors: Collection[str], expected: Collection[str]) -> bool:
        return len(contributors) >= 1

    def rescale(self, total: np.ndarray, present: int, full: int) -> np.ndarray:
        return total
