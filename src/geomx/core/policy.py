"""The sync policy: the interface through which an algorithm says when a round of pushes is complete.

FSA (``dist_sync``) waits for every awaited client; MixedSync (``dist_async``) releases every push on
arrival. The core's round table asks its policy and imports no implementation (see ``geomx.sync``).

Usage::

    class EveryPush(SyncPolicy):
        name = "every_push"
        def round_complete(self, contributors, awaited): return len(contributors) >= 1
        def rescale(self, total, present, full): return total
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection

import numpy as np


class SyncPolicy(ABC):
    """Decides when the contributions collected so far make a complete round of pushes."""

    name = ""
    # Whether a client may leave (shut down) while others still push. Only where rounds never wait for
    # every client: under FSA an early leaver would stall everyone else's next round.
    clients_leave_independently = False

    @abstractmethod
    def round_complete(self, contributors: Collection[str], awaited: Collection[str]) -> bool:
        """Whether a round with ``contributors`` in, waiting for ``awaited``, may be released."""

    @abstractmethod
    def rescale(self, total: np.ndarray, present: int, full: int) -> np.ndarray:
        """The sum of a round that ``present`` of the tier's ``full`` workers pushed to, as the tier applies it
        (a round with clients missing: scaled to the full tier, or applied as it is)."""
