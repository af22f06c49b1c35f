"""Early answers: under FSA across parties, the last party to push a slice gets the others' sum before its push
has even arrived, and adds its own.

Why: a global server can answer a slice only once every party's sum is in, so on a full-duplex WAN the answer
to the last party (the one whose push crosses the link last) starts only after its push has arrived: the
answers trail the pushes by a slice and the link's queueing, and each direction idles part of the step
(``benchmarks/step_timeline.py`` shows it: 0.14 s of a 0.54 s step on the 100 Mbit/s kernel link). But the
last party knows its own sum already. As soon as every *other* party has pushed a slice, the global server sends
the last one their sum (``send_early``). Its local server answers its workers with the others' sum plus the sum
it pushed as soon as it holds both (``EarlyAnswers``), often before its push has even crossed the link; when
its push completes the round, the global server's answer carries no tensor, only the round number
(``RoundTable.release``), and closes the round. Same bytes on the link, but both directions now flow at once.
The result is bit-identical: the global server sums in arrival order, ``accum + last``, and the local server
computes exactly ``np.add(accum, last)``.

When a round's only contributor is the one party (a job of one party), the others' sum is empty: the global
server answers that party's push without a tensor, flagged ``ALONE``, and the party takes its own push as the
answer. Its pushes still cross, to keep the global tier's model, rounds and checkpoints; the answers' bytes do not.

Only where the answer is the plain sum: a HiPS global server with FSA, no server optimizer, the plain
aggregation, no WAN codec and no wide-float encoding, the direct route alone: each plug-in declares it
(``answers_plain_sums`` of the sync policy, the aggregation and the route; ``geomx.server.pushpull``); a
round that lost a client on the way (rescaled) answers in full as before. Should the answer stop being the plain
sum between an early sum and its round's end (the master sets a server optimizer mid-job), the local server that
used it stops the job with the reason rather than let the parties' models differ.

One client takes the early sums, keyed alike by (global server, key, slice) and the round's number, and settles
them by one of two policies (``Settle``): a local server answers its workers at once, as soon as it holds both
sums (``AT_ONCE``); a collective party's rank, whose push is its owned piece itself, adds the others' sum into the
piece when the round's tensor-less answer arrives (``ON_REPLY``).

Usage (global server, after a push joined its round; local server, when it forwards a push and on answers; a
collective rank, when a round's answer arrives)::

    if early_ok: send_early(server, rnd)
    early.forwarded(owner, key, index, upward_tensor, answer)   # answer(others + upward) once both are in
    if early.settled(owner, reply): return                     # the tensor-less answer of such a round
    ranks_early = EarlyAnswers(Settle.ON_REPLY)
    if EarlyAnswers.bare(reply): others = ranks_early.others(server, reply)   # None: this party alone pushed
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from enum import Enum
from typing import Protocol

import numpy as np

from ..protocol.wire import Kind, Message
from .rounds import ALONE, EARLY, Round


class EarlyHost(Protocol):
    """What ``send_early`` needs from a global server."""

    def send(self, peer: str, message: Message) -> None: ...


def last_missing(rnd: Round, awaited: set[str]) -> str | None:
    """The one awaited client that has not pushed to ``rnd`` yet, if exactly one is missing (else None)."""
    missing = awaited - rnd.contributions.keys()
    return next(iter(missing)) if len(missing) == 1 and rnd.contributions else None


def send_early(host: EarlyHost, rnd: Round, awaited: set[str],
               address: Callable[[str], str | None] = lambda client: client) -> None:
    """If every awaited client but one has pushed to the open round ``rnd``, send that one the others' sum now
    (once per round; ``rnd.early`` remembers to whom), at its ``address``: the client itself, or the rank of a
    collective party that owns the slice (None: not known, so it gets its answer with the others)."""
    if rnd.kind is not Kind.PUSHPULL or rnd.forwarding or rnd.early is not None or rnd.accum is None:
        return
    last = last_missing(rnd, awaited)
    to = address(last) if last is not None else None
    if last is None or to is None:
        return
    first = next(iter(rnd.contributions.values()))
    if len(rnd.contributions) == 1 and first.tensor is not None and first.tensor.dtype != rnd.accum.dtype:
        # one other party's float16 push, summed in float32: the push itself is the same numbers at half the
        # bytes (the float32 sum doubled the WAN's answer bytes of a float16 key)
        others = first.tensor
    else:
        # a sum the table owns is added to in place when the last push arrives: send a snapshot; a single
        # contribution is the received (read-only) buffer and stays as it is
        others = rnd.accum.copy() if rnd.accum.flags.writeable else rnd.accum
    rnd.early = last
    host.send(to, Message(Kind.PUSHPULL, key=rnd.key, slice=rnd.slice, num_slices=first.num_slices, round=rnd.number,
                            priority=first.priority, tensor=others, body={EARLY: rnd.number}))


def _plus(others: np.ndarray, pushed: np.ndarray) -> np.ndarray:
    """``others + pushed`` as the global server adds them: float16 in float32 (its sums of narrow floats are
    float32; the caller casts back to the declared dtype, as the global server does), so the answers agree bit
    for bit whatever NumPy's own float16 arithmetic would round."""
    return np.add(others, pushed, dtype=np.result_type(others, pushed, np.float32))


Answer = Callable[[np.ndarray], None]
SliceOf = tuple[str, int, int]  # (global server, key, slice)


class Settle(Enum):
    """How a client settles a round answered early."""

    AT_ONCE = "at once"  # a local server: answers its workers once it holds the others' sum and its own push's
    ON_REPLY = "on reply"  # a collective rank: adds the others' sum into its piece when the bare answer arrives


class EarlyAnswers:
    """A client's side of early answers: the others' sums it was sent, by (global server, key, slice) and round,
    settled by its policy (``Settle``); thread-safe (the van's thread stores, another may take).

    ``AT_ONCE`` (a local server): it answers its workers as soon as it holds both the others' sum and its own
    push's, whichever comes second, and then only checks the global server's tensor-less answer when it arrives.
    Per (global server, key, slice) one round at a time is in flight (the next push of a slice follows this
    round's answer, and everything from a global server comes on one ordered connection), so an early sum and
    a forwarded push of the same slice belong to the same round.

    ``ON_REPLY`` (a collective rank): the sums wait until the training thread lands the round's answer
    (``others``); by round, as the next round's early sum may come before this round's is taken.
    """

    def __init__(self, settle: Settle = Settle.AT_ONCE) -> None:
        self.settle = settle
        self._lock = threading.Lock()
        self._sums: dict[SliceOf, dict[int, np.ndarray]] = {}  # early sums not taken yet, by round
        self._waiting: dict[SliceOf, tuple[np.ndarray, Answer]] = {}  # pushes before (or without) an early sum
        self._answered: dict[SliceOf, int] = {}  # answered early: the global round, until its answer arrives

    @staticmethod
    def is_early(message: Message) -> bool:
        """Whether ``message`` (not a reply) is an early answer (the others' sum)."""
        return message.kind is Kind.PUSHPULL and not message.is_reply and EARLY in (message.body or {})

    @staticmethod
    def bare(reply: Message) -> bool:
        """Whether ``reply`` is the tensor-less answer that closes a round answered early (or answers a push with
        itself, flagged ``ALONE``)."""
        return reply.tensor is None and reply.encoded is None and EARLY in (reply.body or {})

    def store(self, sender: str, message: Message) -> None:
        """The others' sum for (key, slice) from global server ``sender``."""
        assert message.tensor is not None and message.body is not None
        where, number = (sender, message.key, message.slice), int(message.body[EARLY])
        with self._lock:
            waiting = self._waiting.pop(where, None) if self.settle is Settle.AT_ONCE else None
            if waiting is None:
                self._sums.setdefault(where, {})[number] = message.tensor
                return
            self._answered[where] = number
        pushed, answer = waiting
        answer(_plus(message.tensor, pushed))

    def others(self, sender: str, reply: Message) -> np.ndarray | None:
        """``ON_REPLY``: the others' sum to add to this party's piece for the round ``reply`` (a ``bare`` answer
        from ``sender``) closes; None where nobody else pushed (``ALONE``: the answer is the piece as pushed).
        LookupError if its early sum never came."""
        body = reply.body or {}
        if body.get(ALONE):
            return None
        where, number = (sender, reply.key, reply.slice), int(body[EARLY])
        with self._lock:
            rounds = self._sums.get(where, {})
            others = rounds.pop(number, None)
            if not rounds:
                self._sums.pop(where, None)
        if others is None:
            raise LookupError(f"closed round {number} of key {reply.key} slice {reply.slice} early, but its early "
                              "sum never came")
        return others

    def forwarded(self, owner: str, key: int, index: int, pushed: np.ndarray, answer: Answer) -> None:
        """``AT_ONCE``: this server pushed ``pushed`` for (key, slice) to ``owner``: ``answer(others + pushed)`` now
        if the others' sum is here, else when it comes (if it does: not when another party pushes last)."""
        where = (owner, key, index)
        with self._lock:
            rounds = self._sums.pop(where, None)
            if not rounds:
                self._waiting[where] = (pushed, answer)
                return
            number = max(rounds)  # the newest (one round at a time is in flight)
            self._answered[where] = number
        answer(_plus(rounds[number], pushed))

    def settled(self, sender: str, reply: Message) -> bool:
        """``AT_ONCE``: whether ``reply`` (the global server's answer) closes a round answered early, or answers our
        push with itself (``ALONE``: answered now; True: nothing more to do); False for an ordinary answer. Raises
        ValueError if the global server answered a round in full that this server had already answered early (the
        answer stopped being the plain sum in between)."""
        where = (sender, reply.key, reply.slice)
        if (reply.body or {}).get(ALONE) and reply.tensor is None and reply.encoded is None:
            with self._lock:
                waiting = self._waiting.pop(where, None)  # nobody else pushed: the answer is our push
            if waiting is None:
                raise ValueError(f"the global server answered key {reply.key} slice {reply.slice} with our own "
                                 "push, which this server never sent it")
            pushed, answer = waiting
            answer(pushed)
            return True
        with self._lock:
            number = self._answered.pop(where, None)
            if number is None:
                self._waiting.pop(where, None)  # answered in full: no early sum comes for this round
                return False
        body = reply.body or {}
        if reply.tensor is not None or reply.encoded is not None or body.get(EARLY) != number:
            raise ValueError(f"the global server answered key {reply.key} slice {reply.slice} in full after its "
                             "early sum had been used: the job's models would differ")
        return True
