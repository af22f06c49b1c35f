"""A client that rejoins in the middle of a synchronous round of pushes waits until that round has ended on every
slice, so that its first push of every slice meets the others' next round.

Why: under a synchronous policy each slice's round waits for every awaited client, and a party pushes its slices
one after another (a collective rank's windows, its ranks' owned slices, a worker's keys as backward makes them).
A client admitted between the others' first and last slice of a round would be awaited by the rounds opened after
it came and not by those before: its first push would land in round ``n`` of some slices and ``n + 1`` of others,
the others wait for slices it has not sent yet, and it waits for answers of rounds they have not started (a
deadlock where the pushes in flight are bounded: the recovery bench's restarted party hit it once in two runs).
Held (``Clients.add(hold=True)``: its pushes kept, its INIT answered at once) until every slice has released the
round under way, it starts in step with them. Decoupled rounds (a round rule) close without it and need no hold. The
slices are those pushed at least once: in the job's first round of pushes the table cannot tell a slice that is
yet to come (and a rejoiner then is taken at once, as before).

Usage (``RoundTable``, under the server lock)::

    ends = RoundEnds()
    target = round_under_way(table.rounds.values())   # None: between two rounds
    ends.wait("dc1/ranks", target)
    ends.due(table.rounds.values(), clients.joining)  # the clients to admit now
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING

from ..protocol.wire import Kind

if TYPE_CHECKING:
    from .rounds import Round


def round_under_way(rounds: Iterable[Round]) -> int | None:
    """The rounds of pushes every slice must have released for the round under way to have ended (None: none is
    under way: every slice has released as many rounds, and none is open)."""
    pushes = [rnd for rnd in rounds if rnd.kind is Kind.PUSHPULL]
    if not pushes:
        return None
    target = max(rnd.number + (1 if rnd.contributions or rnd.folded else 0) for rnd in pushes)
    return target if min(rnd.number for rnd in pushes) < target else None


class RoundEnds:
    """Held joiners, each with the count of released rounds it waits for on every slice."""

    def __init__(self) -> None:
        self.targets: dict[str, int] = {}

    def wait(self, client: str, target: int) -> None:
        self.targets[client] = target

    def due(self, rounds: Iterable[Round], joining: Collection[str]) -> list[str]:
        """The joiners whose round has ended on every slice (forgotten here: the caller admits them); joiners no
        longer ``joining`` (admitted otherwise, or dropped) are forgotten too."""
        if not self.targets:
            return []
        released = min((rnd.number for rnd in rounds if rnd.kind is Kind.PUSHPULL), default=None)
        due = [client for client, target in self.targets.items()
               if client in joining and (released is None or released >= target)]
        for client in [c for c in self.targets if c in due or c not in joining]:
            del self.targets[client]
        return due
