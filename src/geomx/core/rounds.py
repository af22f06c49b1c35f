"""The round table: per (kind, key, slice), collect the clients' contributions, sum them, release the result.

A round opens with its first contribution and completes when the awaited clients are in (a request kind's
rule: pushes follow the job's sync policy, every other kind waits for every awaited client). The host then
reduces it as its algorithm says (``RoundTableHost.complete``) and answers it through ``release``, which replies
to every contributor in one go and opens the next round, replaying the requests that arrived early for it.
A round that misses its deadline fails, naming whom it waited for.

A client's pushes for later rounds (it got its answer early: ``SyncPolicy.may_answer``) queue in order behind
the open round. The table counts, per client, how far ahead of the last completed round each answer let
it run (``leads``): 0 for an answer at its round's release. Where its policy says so
(``SyncPolicy.counts_staleness``: pushes applied on arrival), it also counts each push's staleness
(``staleness``): how many rounds of its slice were released since its sender's last answer for that slice. The
table knows no algorithm and no socket: the host sends, so a unit test drives it in one process with a fake host.

A round rule (``RoundRule``: an algorithm's decoupled rounds) closes rounds of pushes itself: a push is on time, late
(folded into the open round, answered at once with the last applied value) or dropped (answered at once); it says
when a round is ready, given the time (the watchdog calls ``complete_ready``).

Usage (inside a server, under its lock)::

    table = RoundTable(host, Clients(["w0", "w1"]), policy)
    table.contribute(push)                  # host.complete(rnd) once every awaited client is in
    table.release(rnd, value)               # every contributor gets ``value``; the next round opens
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol

import numpy as np

from ..codecs.half import from_half
from ..protocol.wire import Kind, Message, MessageKind
from .clients import Clients
from .joiners import RoundEnds, round_under_way
from .policy import SyncPolicy
from .round_times import RoundTimes

log = logging.getLogger("geomx.server")

EARLY = "early"  # body key of an early answer and of the answer after it: the round's number (geomx.core.early)
# body key, beside EARLY, of the answer to a round's only contributor: the others' sum is empty, so the answer is
# that contributor's own push and carries no tensor (geomx.core.early)
ALONE = "alone"
# body key of an answer that carries the change of the global model since the last answer, not the model (an
# aggregation that answers with weights, under a residual codec); a client adds it to the last global model it holds
MODEL_CHANGE = "model_change"
# body key of an INIT answer without the value: the client holds the same bytes already (its INIT's digest matched)
SAME = "same"

RoundId = tuple[MessageKind, int, int]
STALENESS_MAX = 1000  # a push staler than this counts as this stale (the report's keys stay few)


@dataclass
class SliceValue:
    """The stored value of one (key, slice): weights, or the latest aggregate."""

    value: np.ndarray


@dataclass
class Round:
    """Contributions to one (kind, key, slice) being collected or forwarded."""

    kind: MessageKind
    key: int
    slice: int
    number: int = 0
    contributions: dict[str, Message] = field(default_factory=dict)
    accum: np.ndarray | None = None
    deferred: list[Message] = field(default_factory=list)
    forwarding: bool = False
    started_at: float = 0.0
    exempt: set[str] = field(default_factory=set)  # clients that joined after this round opened: not awaited
    early: str | None = None  # the client that got the others' sum early (geomx.core.early): answered without it
    same: set[str] = field(default_factory=set)  # INIT: clients that hold the value already (answered without it)
    seen: dict[str, int] = field(default_factory=dict)  # client -> rounds released when it last got an answer
    base: int = 0  # rounds released before this server started (a resumed count): what a new client has seen
    arrivals: dict[str, float] = field(default_factory=dict)  # a round rule's: client -> when its push came
    folded: list[Message] = field(default_factory=list)  # a round rule's late pushes, answered already
    folded_from: list[str] = field(default_factory=list)  # their clients (a collective party's, not its rank's)

    def describe(self) -> str:
        return f"{self.kind.name} round {self.number} of key {self.key} slice {self.slice}"


class Admission(Enum):
    """What a round rule makes of a push: it joins its round, is folded in late, or is dropped."""
    ON_TIME = "on_time"
    LATE = "late"
    DROPPED = "dropped"


class RoundRule(Protocol):
    """A rule that closes rounds of pushes itself, by time (decoupled rounds); pure: it reads the time it is given."""
    def admit(self, rnd: Round, client: str, now: float) -> Admission:
        """A push of ``client`` for the open ``rnd``."""

    def ready(self, rnd: Round, awaited: Collection[str], now: float) -> bool:
        """Whether ``rnd`` may close now."""

    def closed(self, rnd: Round, awaited: Collection[str], display: Callable[[str], str],
               dead: Collection[str]) -> None:
        """``rnd`` closes (before its answers): record its status (``dead``: the clients dropped as dead)."""

    def report(self, display: Callable[[str], str]) -> dict[str, Any]:
        """The rounds' status, for the stats file and the heartbeats."""


class RoundTableHost(Protocol):
    """What the table asks of the server that owns it (a fake one in unit tests)."""

    name: str

    def send(self, peer: str, message: Message) -> None:
        """Send ``message`` to ``peer``."""

    def complete(self, rnd: Round) -> None:
        """``rnd`` is complete (its ``forwarding`` is set): reduce it and, now or later, ``release`` it."""

    def redeliver(self, message: Message) -> None:
        """Handle again a request that was deferred to the next round or held."""

    def display(self, client: str) -> str:
        """A client's name for logs and errors."""

    def answer_early(self, rnd: Round, message: Message) -> None:
        """Answer the push ``message`` before ``rnd`` completes, with the last applied value."""

    def all_done(self) -> None:
        """A SHUTDOWN round was released: every client has shut down."""


class RoundTable:
    """The open rounds of one server (the caller holds the server lock)."""

    def __init__(self, host: RoundTableHost, clients: Clients, policy: SyncPolicy,
                 clock: Callable[[], float] = time.monotonic, rule: RoundRule | None = None) -> None:
        self.host = host
        self.clients = clients
        self.policy = policy  # for rounds of pushes; every other kind waits for every awaited client
        self.clock = clock
        self.rule = rule  # closes rounds of pushes instead of the policy (decoupled rounds), if any
        self.rounds: dict[RoundId, Round] = {}
        self.answered_early: set[tuple[str, int]] = set()  # (sender, request id) of pushes answered early
        self.leads: dict[str, Counter[int]] = {}  # client -> {rounds ahead an answer let it run: answers}
        self.staleness: dict[str, Counter[int]] = {}  # client -> {rounds released since its last answer: pushes}
        self.times = RoundTimes()  # rounds of pushes answered, by duration
        self.round_ends = RoundEnds()  # joiners held until the round of pushes under way ends (geomx.core.joiners)

    # -- collect ------------------------------------------------------------------------------------------
    def get(self, kind: MessageKind, key: int, index: int) -> Round | None:
        return self.rounds.get((kind, key, index))

    def restore(self, kind: MessageKind, key: int, index: int, number: int) -> None:
        """Start (key, slice)'s rounds of ``kind`` at ``number`` (a resumed checkpoint's count)."""
        self.rounds[(kind, key, index)] = Round(kind, key, index, number=number, base=number)

    def completed(self, kind: MessageKind, key: int, index: int) -> int:
        """How many rounds of ``kind`` of (key, slice) were released."""
        rnd = self.rounds.get((kind, key, index))
        return rnd.number if rnd is not None else 0

    def has_kind(self, kind: MessageKind) -> bool:
        return any(k == kind for k, _, _ in self.rounds)  # ==: a received PluginKind is not the declared object

    def contribute(self, message: Message) -> None:
        """Add ``message`` to its round (or defer it to the next one); complete the round if it is ready.

        The first tensor is kept as the received (read-only) buffer; the second allocates the sum; later ones
        add in place: one pass over memory per contribution, no copy. Half precision is summed in float32.
        """
        rid: RoundId = (message.kind, message.key, message.slice)
        rnd = self.rounds.get(rid)
        if rnd is None:
            rnd = self.rounds[rid] = Round(message.kind, message.key, message.slice)
        client = self.clients.client_of(message.sender.decode())
        if rnd.forwarding or client in rnd.contributions:
            rnd.deferred.append(message)  # belongs to a later round: queued in order
            self._maybe_answer_early(rnd, message)
            return
        if self.rule is not None and message.kind is Kind.PUSHPULL and self._ruled(rnd, client, message):
            return
        if not rnd.contributions:
            rnd.started_at = self.clock()
        rnd.contributions[client] = message
        if message.kind is Kind.PUSHPULL and self.policy.counts_staleness:
            stale = min(rnd.number - rnd.seen.get(client, rnd.base), STALENESS_MAX)
            self.staleness.setdefault(client, Counter())[stale] += 1
        if message.kind is Kind.PUSHPULL and message.tensor is not None:
            if rnd.accum is None:
                tensor = message.tensor
                rnd.accum = from_half(tensor) if tensor.dtype == np.float16 else tensor
            elif not rnd.accum.flags.writeable or self.rule is not None:  # (a rule's merge reads the pushes)
                rnd.accum = np.add(rnd.accum, message.tensor)
            else:
                np.add(rnd.accum, message.tensor, out=rnd.accum)
        if self.ready(rnd):
            self._complete(rnd)
        else:
            self._maybe_answer_early(rnd, message)

    def _ruled(self, rnd: Round, client: str, message: Message) -> bool:
        """The round rule admits a push: True if it was answered at once (late: folded into ``rnd``; dropped)."""
        assert self.rule is not None
        now = self.clock()
        admission = self.rule.admit(rnd, client, now)
        if admission is Admission.ON_TIME:
            rnd.arrivals[client] = now
            return False
        if admission is Admission.LATE:
            rnd.started_at = rnd.started_at if rnd.contributions or rnd.folded else now
            rnd.folded.append(message)
            rnd.folded_from.append(client)
            if message.tensor is not None:  # (the plain sum; a rule's aggregation may merge ``folded`` its own way)
                rnd.accum = message.tensor if rnd.accum is None else np.add(rnd.accum, message.tensor)
        else:
            log.info("[%s] dropped a push of %s for %s: %d rounds late", self.host.name, self.host.display(client),
                     rnd.describe(), rnd.number - rnd.seen.get(client, rnd.base))
        rnd.seen[client] = rnd.number  # answered with the last applied value
        self.host.answer_early(rnd, message)
        return True

    def ahead(self, rnd: Round, client: str) -> int:
        """How many rounds beyond ``rnd``'s last completed one ``client``'s pushes collected so far reach."""
        queued = sum(1 for m in rnd.deferred if self.clients.client_of(m.sender.decode()) == client)
        return queued + (1 if client in rnd.contributions else 0)

    def _maybe_answer_early(self, rnd: Round, message: Message) -> None:
        """A push not applied yet: answer it now if the policy lets its sender run that far ahead."""
        sender = message.sender.decode()
        mark = (sender, message.request_id)  # request ids are per connection
        if message.kind is not Kind.PUSHPULL or mark in self.answered_early:
            return
        client = self.clients.client_of(sender)
        ahead = self.ahead(rnd, client)
        if self.policy.may_answer(ahead):
            self.answered_early.add(mark)
            self._count_lead(client, ahead)
            rnd.seen[client] = rnd.number  # the last applied value
            self.host.answer_early(rnd, message)

    def _count_lead(self, client: str, ahead: int) -> None:
        self.leads.setdefault(client, Counter())[ahead] += 1

    def leads_report(self) -> dict[str, dict[str, int]]:
        """Per client (by display name): how many of its answers let it run how many rounds ahead."""
        return self._by_display(self.leads)

    def reports(self) -> dict[str, Any]:
        """What the heartbeats and the stats file report per client (by display name): ``leads``
        (``leads_report``) and ``staleness``, how many of its pushes were how many updates of their slice stale."""
        reports: dict[str, Any] = {"leads": self.leads_report(), "staleness": self._by_display(self.staleness)}
        if self.rule is not None:
            reports["rounds"] = self.rule.report(self.host.display)
        return reports

    def _by_display(self, counts: dict[str, Counter[int]]) -> dict[str, dict[str, int]]:
        """``counts`` per client as a report: keyed by display name, each count's key as text, in order."""
        return {self.host.display(c): {str(k): v for k, v in sorted(n.items())} for c, n in counts.items()}

    def awaited(self, rnd: Round) -> set[str]:
        return self.clients.awaited(rnd.exempt)

    def ready(self, rnd: Round) -> bool:
        awaited = self.awaited(rnd)
        if rnd.kind is Kind.PUSHPULL and self.rule is not None:
            return self.rule.ready(rnd, awaited, self.clock())
        if rnd.kind is Kind.PUSHPULL:
            return self.policy.round_complete(rnd.contributions.keys(), awaited)
        return awaited <= rnd.contributions.keys()

    def complete_ready(self) -> None:
        """Complete every open round whose awaited clients are all in (after a client left or was dropped; a round
        rule's round of late pushes alone, once no client is awaited). If only held joiners remain, no cycle will
        end to admit them: admit them now."""
        if self.clients.only_joining_remain():
            self.admit()
        for rnd in list(self.rounds.values()):
            if (rnd.contributions or rnd.folded) and not rnd.forwarding and self.ready(rnd):
                self._complete(rnd)

    def hold_until_round_ends(self, client: str) -> bool:
        """Hold a (re)joining ``client`` until the synchronous round of pushes under way has ended on every slice
        (``geomx.core.joiners``); True if one is under way (it is held)."""
        target = round_under_way(self.rounds.values()) if self.policy.synchronous and self.rule is None else None
        if target is None:
            return False
        self.clients.add(client, hold=True)
        self.round_ends.wait(client, target)
        return True

    def admit(self, only: Collection[str] | None = None) -> None:
        """The others finished a cycle (or the round ``only`` waited for): held joiners take part from the next one
        (their requests replayed)."""
        for client, held in self.clients.admit(only).items():
            log.info("[%s] %s takes part from the next cycle (%d requests held)", self.host.name,
                     self.host.display(client), len(held))
            for message in held:
                self.host.redeliver(message)

    def exempt_open(self, client: str) -> None:
        """Rounds already open do not wait for ``client`` (it joined after they opened)."""
        for rnd in self.rounds.values():
            if rnd.contributions:
                rnd.exempt.add(client)

    def _complete(self, rnd: Round) -> None:
        rnd.forwarding = True
        if self.rule is not None and rnd.kind is Kind.PUSHPULL:
            self.rule.closed(rnd, self.awaited(rnd), self.host.display, self.clients.dropped)
        self.host.complete(rnd)

    # -- release ------------------------------------------------------------------------------------------
    def is_current(self, rnd: Round, number: int | None) -> bool:
        """Whether an answer for round ``number`` (None: any) may still release ``rnd`` (a late answer to a
        round that already failed by timeout is dropped, logged)."""
        if number is not None and (rnd.number != number or not rnd.forwarding):
            log.warning("[%s] dropped a late answer for %s", self.host.name, rnd.describe())
            return False
        return True

    def release(self, rnd: Round, value: np.ndarray | None, error: str | None = None,
                number: int | None = None, body: dict[str, Any] | None = None,
                fields: dict[str, Any] | None = None) -> None:
        """Answer every contributor of ``rnd`` (with ``fields``, ``value`` and ``body``, or ``error``), then
        open the next round and replay the requests deferred to it."""
        if not self.is_current(rnd, number):
            return
        for client, message in rnd.contributions.items():
            sender = message.sender.decode()  # the connection that asked (a collective party's owning rank)
            if (sender, message.request_id) in self.answered_early:  # it has its answer and went on
                self.answered_early.discard((sender, message.request_id))
                continue
            if message.kind is Kind.PUSHPULL and not error:
                self._count_lead(client, 0)
                rnd.seen[client] = rnd.number + 1  # this round's value
            if error:
                reply = message.error(f"{self.host.name}: {error}")
            elif client == rnd.early:  # it has the others' sum already and adds its own (geomx.core.early)
                alone = len(rnd.contributions) == 1  # ... of nobody: its answer is its push
                reply = message.reply(body={EARLY: rnd.number, ALONE: True} if alone else {EARLY: rnd.number})
            elif client in rnd.same:  # INIT: it holds these bytes already
                reply = message.reply(body={SAME: True})
            else:
                reply = message.reply(**fields) if fields else message.reply(tensor=value, body=body)
            self.host.send(sender, reply)
        if error:
            log.error("[%s] %s failed: %s", self.host.name, rnd.describe(), error)
        elif rnd.kind is Kind.PUSHPULL:
            self.times.add(self.clock() - rnd.started_at)
        finished_shutdown = rnd.kind is Kind.SHUTDOWN and not error
        rnd.contributions = {}
        rnd.accum = None
        rnd.forwarding = False
        rnd.exempt = set()
        rnd.early = None
        rnd.same = set()
        rnd.arrivals = {}
        rnd.folded, rnd.folded_from = [], []
        rnd.number += 1
        deferred, rnd.deferred = rnd.deferred, []
        for message in deferred:
            self.host.redeliver(message)
        if rnd.kind is Kind.PUSHPULL and self.round_ends.targets:
            self.admit(self.round_ends.due(self.rounds.values(), self.clients.joining))
        if finished_shutdown:
            self.host.all_done()

    def fail_open(self, text: str) -> None:
        """Fail every open round with ``text`` (their clients see why)."""
        for rnd in list(self.rounds.values()):
            if rnd.contributions:
                self.release(rnd, None, text)

    def expire(self, round_s: float, request_s: float) -> None:
        """Fail rounds that waited longer than their limit (collecting: ``round_s``; waiting for the tier
        above: ``request_s``), naming whom they wait for."""
        now = self.clock()
        for rnd in list(self.rounds.values()):
            if not rnd.contributions:
                continue
            limit = request_s if rnd.forwarding else round_s
            if now - rnd.started_at <= limit:
                continue
            if rnd.forwarding:
                what = "the global server to answer"
            else:
                missing = sorted(self.host.display(c) for c in self.awaited(rnd) - set(rnd.contributions))
                what = f"clients {missing}"
            self.release(rnd, None, f"{rnd.describe()} timed out after {limit:g} s waiting for {what}")
