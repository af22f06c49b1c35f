"""How long a server's rounds of pushes took: a histogram its heartbeats carry to the status page.

Usage (``RoundTable.release``)::

    times = RoundTimes()
    times.add(0.02)          # one round of pushes, from its first contribution to its answers
"""

from __future__ import annotations

import bisect

from ..protocol.bodies import ROUND_BUCKETS_S


class RoundTimes:
    """How long a server's rounds of pushes took, from the first contribution to the answers: counts per
    ``ROUND_BUCKETS_S`` bucket (and one above the last) and their sum, since the server started (its heartbeats
    carry them to the status page's histogram)."""

    def __init__(self) -> None:
        self.counts = [0] * (len(ROUND_BUCKETS_S) + 1)
        self.seconds = 0.0

    def add(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(ROUND_BUCKETS_S, seconds)] += 1
        self.seconds += seconds
