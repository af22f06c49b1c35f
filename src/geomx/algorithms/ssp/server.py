"""Bounded staleness (``dist_ssp``, Stale Synchronous Parallel across parties): a party may run at most
``staleness`` global rounds ahead of the slowest one.

The arithmetic is FSA's: each global round sums every party's push for that round and applies the sum once
(scaled as FSA scales a round with parties missing). What changes is *when a party is answered*: a party
whose push is not applied yet may get its answer at once, if that lets it run at most ``staleness`` rounds
beyond the last completed round. Its answer is then the latest applied model, which does *not* contain its
own still-pending gradients (nor the other parties' for the open rounds). Its next pushes queue in order
behind the open round (the round table keeps them) and join their rounds as the rounds complete.

A party lost (its local server declared dead) is dropped and the others go on, their rounds scaled as FSA scales a
round with parties missing; restarted, it rejoins with the current model (``geomx.server.departures``). Shutdown is
still a round every party joins: a party that finished first has pushes queued behind open rounds, which must join
their own rounds (had it left alone, later rounds would be rescaled without it and its pushes applied out of turn).

``staleness = 0`` answers every push at its round's completion: FSA's arithmetic exactly (the same code path), but
a lost party does not stop it. A large bound approaches MixedSync's *waiting* (a fast party is never held up) but
not its arithmetic: MixedSync applies each push alone as it arrives, here a round's pushes are still summed and
applied together once every party has sent its own. The answer is weights, so the global servers need an optimizer.

Usage::

    geomx.kv.create("dist_ssp")                     # with `training: {staleness: 2}` or GEOMX_STALENESS=2
    BoundedStaleness(staleness=2).may_answer(2)     # True: two rounds ahead of the last completed one
"""

from __future__ import annotations

from typing import ClassVar

from ..fsa.server import FullySynchronous


class BoundedStaleness(FullySynchronous):
    """SSP: FSA's rounds; a party's answer may come early, up to ``staleness`` rounds ahead."""

    name = "dist_ssp"
    title = "SSP"
    synchronous = False  # answers may precede their round: model averaging would mix rounds
    needs_server_optimizer = True  # an early answer is the applied model: weights, not a sum of gradients
    answers_plain_sums = False  # a party may be answered before its round completes
    drops_dead_clients = True  # a party runs ahead of the others anyway: one lost stops nobody (shutdown: a round)
    options: ClassVar[dict[str, type]] = {"staleness": int}

    def __init__(self, staleness: int = 2) -> None:
        if staleness < 0:
            raise ValueError(f"staleness must be >= 0 (0 is FSA), got {staleness}")
        self.staleness = staleness

    def may_answer(self, ahead: int) -> bool:
        return ahead <= self.staleness
