"""The interfaces the server core owns; algorithms plug into them (see docs/server-core-plan.md).

A sync policy decides when a round of pushes is complete and whether clients may leave on their own. The core
imports no implementation: the composition root hands it one, chosen by name from a registry.

Usage::

    class EveryPush(SyncPolicy):
        name = "every_push"
        def round_complete(self, contributors, awaited): return len(contributors) >= 1
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection


class SyncPolicy(ABC):
    """Decides when the contributions collected so far make a complete round of pushes."""

    name = ""
    # Whether a client may leave (shut down) while others still push. Only where rounds never wait for
    # every client: under FSA an early leaver would stall everyone else's next round.
    clients_leave_independently = False

    @abstractmethod
    def round_complete(self, contributors: Collection[str], awaited: Collection[str]) -> bool:
        """Whether a round with ``contributors`` in, waiting for ``awaited``, may be released."""
