"""The sync policy: the interface through which an algorithm says when a round of pushes is complete.

FSA (``dist_sync``) waits for every awaited client; MixedSync (``dist_async``) releases every push on
arrival. A policy may also let a contributor go on before its round completes (``may_answer``: bounded
staleness). The core's round table asks its policy and imports no implementation (see ``geomx.algorithms``).

A policy declares what it needs of the rest of the job as class attributes (the wrapper's plan and the
composition root read them, so a new policy needs no edit there) and the options it takes (``options``:
name -> type; the composition root parses the job's plug-in options and passes them to the constructor).

Usage::

    class EveryPush(SyncPolicy):
        name = "every_push"
        def round_complete(self, contributors, awaited): return len(contributors) >= 1
        def rescale(self, total, present, full): return total
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection
from typing import ClassVar

import numpy as np

from .capabilities import Capabilities


class SyncPolicy(Capabilities, ABC):
    """Decides when the contributions collected so far make a complete round of pushes."""

    name = ""
    title = ""  # what people call it, for messages ("MixedSync")
    # Whether a client may leave (shut down) while others still push. Only where rounds never wait for
    # every client: under FSA an early leaver would stall everyone else's next round.
    clients_leave_independently = False
    # Whether a dead client is dropped and the others go on, while shutdown stays a round every client joins: a
    # policy whose pushes queue behind open rounds (SSP) must keep a finished client's queued pushes in their own
    # rounds, not let it leave and have later rounds rescaled without it.
    drops_dead_clients = False
    # Whether every client's answer is the result of one round over every client (a synchronous tier):
    # what algorithms that average models need.
    synchronous: ClassVar[bool] = False
    # Whether a client's answer may be a model its own push is not part of yet (the server applies pushes
    # as they come, or answers before a round completes): the answer must then be weights, so the global
    # servers need an optimizer; an answered sum of gradients would mean nothing.
    needs_server_optimizer: ClassVar[bool] = False
    # Whether the round table counts each push's staleness (rounds of its slice released since its sender's last
    # answer for it): where pushes are applied as they come, so that a party may push on a model others moved.
    counts_staleness: ClassVar[bool] = False
    # (``options`` and ``answers_plain_sums``: geomx.core.capabilities; a policy answers plain sums only where
    # every round's answer is the sum of all awaited clients' pushes, released when the last one is in.)
    answers_plain_sums = False

    @abstractmethod
    def round_complete(self, contributors: Collection[str], awaited: Collection[str]) -> bool:
        """Whether a round with ``contributors`` in, waiting for ``awaited``, may be released."""

    @abstractmethod
    def rescale(self, total: np.ndarray, present: int, full: int) -> np.ndarray:
        """The sum of a round that ``present`` of the tier's ``full`` workers pushed to, as the tier applies it
        (a round with clients missing: scaled to the full tier, or applied as it is)."""

    def may_answer(self, ahead: int) -> bool:
        """Whether a contributor whose push is not applied yet may get its answer now (the last applied
        value), letting it compute ``ahead`` rounds beyond the last completed one. Default: never (a
        contributor's answer is its round's result)."""
        return False
