"""Early answers: under FSA across parties, the last party to push a slice gets the others' sum before its push
has even arrived, and adds its own.

Why: a global server can answer a slice only once every party's sum is in, so on a full-duplex WAN the answer
to the last party (the one whose push crosses the link last) starts only after its push has arrived: the
answers trail the pushes by a slice and the link's queueing, and each direction idles part of the step
(``benchmarks/step_timeline.py`` shows it: 0.14 s of a 0.54 s step on the 100 Mbit/s kernel link). But the
last party knows its own sum already. As soon as every *other* party has pushed a slice, the global server sends
the last one their sum (``send_early``); when its push completes the round, its answer carries no tensor, only
the round number (``early_reply_body``), and its local server answers its workers with the others' sum plus the
sum it pushed (``EarlyAnswers.combine``). Same bytes on the link, but the answers now flow while the pushes
still do. The result is bit-identical: the global server sums in arrival order, ``accum + last``, and the local
server computes exactly ``np.add(accum, last)``.

Only where the answer is the plain sum: a HiPS global server with FSA, no server optimizer, the plain
aggregation (not HFA / ESync), no WAN codec, no fp16, no DGT, the direct route (``eligible``); a round that lost a
client on the way (rescaled) answers in full as before.

Usage (global server, after a push joined its round; local server, with the global server's answer)::

    if early_ok: send_early(server, rnd)
    tensor = early.combine(reply, upward_tensor)   # None: not an early answer
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from ..wire import Kind, Message
from .rounds import EARLY, Round


class EarlyHost(Protocol):
    """What ``send_early`` needs from a global server."""

    def send(self, peer: str, message: Message) -> None: ...


def last_missing(rnd: Round, awaited: set[str]) -> str | None:
    """The one awaited client that has not pushed to ``rnd`` yet, if exactly one is missing (else None)."""
    missing = awaited - rnd.contributions.keys()
    return next(iter(missing)) if len(missing) == 1 and rnd.contributions else None


def send_early(host: EarlyHost, rnd: Round, awaited: set[str]) -> None:
    """If every awaited client but one has pushed to the open round ``rnd``, send that one the others' sum now
    (once per round; ``rnd.early`` remembers to whom)."""
    if rnd.kind is not Kind.PUSHPULL or rnd.forwarding or rnd.early is not None or rnd.accum is None:
        return
    last = last_missing(rnd, awaited)
    if last is None:
        return
    first = next(iter(rnd.contributions.values()))
    # a sum the table owns is added to in place when the last push arrives: send a snapshot; a single
    # contribution is the received (read-only) buffer and stays as it is
    others = rnd.accum.copy() if rnd.accum.flags.writeable else rnd.accum
    rnd.early = last
    host.send(last, Message(Kind.PUSHPULL, key=rnd.key, part=rnd.part, num_parts=first.num_parts, round=rnd.number,
                            priority=first.priority, tensor=others, body={EARLY: rnd.number}))


class EarlyAnswers:
    """A local server's early answers from its global servers, until the answer of their round arrives."""

    def __init__(self) -> None:
        # one per (global server, key, slice): a newer round's sum replaces one whose round failed
        self._sums: dict[tuple[str, int, int], tuple[int, np.ndarray]] = {}

    @staticmethod
    def is_early(message: Message) -> bool:
        """Whether ``message`` (not a reply) is an early answer (the others' sum)."""
        return message.kind is Kind.PUSHPULL and not message.is_reply and EARLY in (message.body or {})

    def store(self, sender: str, message: Message) -> None:
        assert message.tensor is not None and message.body is not None
        self._sums[(sender, message.key, message.part)] = (int(message.body[EARLY]), message.tensor)

    def combine(self, sender: str, reply: Message, pushed: np.ndarray | None) -> np.ndarray | None:
        """The round's value for an answer that says the others' sum came early: that sum plus ``pushed`` (what
        this server pushed); None when ``reply`` is an ordinary answer. Raises KeyError if the early sum never
        came (cannot happen on one ordered connection; a bug otherwise)."""
        if reply.tensor is not None or EARLY not in (reply.body or {}) or pushed is None:
            return None
        assert reply.body is not None
        number, others = self._sums.pop((sender, reply.key, reply.part))
        if number != int(reply.body[EARLY]):
            raise KeyError(f"early sum of round {number}, answer of round {reply.body[EARLY]}")
        return np.add(others, pushed)
