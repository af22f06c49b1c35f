"""Rounds of pushes (PUSHPULL): a client's push joins its round; a completed round goes one tier up (a local
server) or is applied (a global server), and every contributor gets the answer.

What a tier does with a completed sum is the plug-ins' call: the sync policy rescales a round with clients
missing, the aggregation says what goes up and what the top tier answers, the route how it travels, the
codec slot how it is encoded, and the server optimizer (if the master set one) steps with it.

Who stopped the job is this part's to note (``geomx.runs.findings``): a round that timed out names the clients it
waited for, and a client that says goodbye while a round can never complete without it (a script that quit early, on
``sys.exit(3)`` or at its own end) is refused at once, naming the round, instead of waiting out the shutdown timeout.

Usage (the server's handler and completion for the kind)::

    pushpulls = PushPulls(server)
    handlers[Kind.PUSHPULL] = pushpulls.on_pushpull
    handlers[Kind.SHUTDOWN] = pushpulls.on_shutdown   # then departures.on_shutdown, unless a round needs the client
    pushpulls.complete(rnd)       # when the round table says a round of pushes is complete
    pushpulls.expire(round_s, request_s)              # the watchdog's: rounds past their deadline fail, noted
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future
from typing import Any, assert_never, cast

import numpy as np

from ..codecs import CodecError
from ..codecs.base import TensorKind
from ..codecs.messages import decode_message, payload_fields
from ..config import Mode
from ..core.capabilities import all_answer_plain_sums
from ..core.checkpoints import MODEL, SUMS, checkpoint_if_due
from ..core.early import send_early
from ..core.inits import value_mismatch
from ..core.plugins import Answer, AwaitAnswer, SendUp, SendUpAndAnswer, SendUpAndAwait, SliceId
from ..core.rounds import Round, SliceValue
from ..protocol.bodies import BodyError, push_tokens
from ..protocol.wire import Kind, Message
from ..runs.findings import LEFT, MISSING, record_finding
from .departures import Departures
from .host import PartHost

log = logging.getLogger("geomx.server")
RULE_TICK_S = 0.02  # how often a round rule (decoupled rounds) is asked whether a round may close by now


class PushPulls:
    """A server's rounds of pushes (see the module docstring)."""

    def __init__(self, host: PartHost) -> None:
        self.host = host
        self.departures = Departures(host)  # (no state of its own: the server's parts share the host's)
        self.noted: set[tuple[str, int, tuple[str, ...]]] = set()  # timeouts noted: (kind, round, missing clients)
        # rounds the aggregation answers once an overlapped send's answer arrives, with their numbers
        self.waiting: dict[SliceId, tuple[Round, int]] = {}
        self.failed_sends: dict[SliceId, str] = {}  # slices whose overlapped send failed: the error they answer
        self.held_pulls: dict[SliceId, list[Message]] = {}  # requests for the job's model, until a send lands

    def on_pushpull(self, message: Message) -> None:
        """A client's push (decoded): checked against its slice, then it joins its round."""
        host = self.host
        stored = host.stored.get((message.key, message.slice))
        if stored is None:
            host.refuse(message, f"key {message.key} slice {message.slice} was never initialized; call init first")
            return
        if message.tensor is None and host.route.accepts_without_tensor(message):
            host.table.contribute(message)  # this party's sum travels inside another party's push
            return
        if message.tensor is None:
            host.refuse(message, f"PUSHPULL of key {message.key} carries no tensor")
            return
        problem = value_mismatch(stored.value.shape, stored.value.dtype, message)
        try:
            push_tokens(message.body)
        except BodyError as exc:
            problem = str(exc)
        if problem:
            host.refuse(message, problem)
            return
        host.table.contribute(message)
        rnd = host.table.get(Kind.PUSHPULL, message.key, message.slice)  # (the table keeps a slice's Round)
        leaving = host.table.get(Kind.SHUTDOWN, 0, 0)  # the goodbyes said: their clients push no more
        if rnd is not None and leaving is not None:
            stranded = next((c for c in leaving.contributions if self._needs(rnd, c)), None)
            if stranded is not None:  # (its goodbye came first) refused now, as ``on_shutdown`` would have
                host.release(leaving, None, self._leaving_early(stranded, rnd))
        host.route.pushed(message)
        if rnd is not None and self.answers_early():
            send_early(host, rnd, host.table.awaited(rnd),
                       address=lambda client: host.clients.address(client, (rnd.key, rnd.slice)))

    def on_shutdown(self, message: Message) -> None:
        """A client says goodbye: ``Departures.on_shutdown``'s, unless an open round (of pushes, or a barrier) that it
        has no part in yet can never complete without it: it is leaving mid-training (a script that quit early, on
        ``sys.exit(3)`` or at its end). Its goodbye is refused at once, naming the round, rather than joining a
        shutdown round that would wait out its timeout, and the finding goes to the run folder. Why not stop the tier
        here too: the others would then exit as fast as the leaver does, and the launcher name whichever exits
        first; the leaver exits first, as a crashed worker does (a non-zero code: the launcher stops the job), and
        the heartbeats declare it dead once it is gone (code 0), which stops the tier, naming it."""
        host = self.host
        client = host.clients.client_of(message.sender.decode())
        for rnd in [r for r in host.table.rounds.values() if r.kind in (Kind.PUSHPULL, Kind.BARRIER)]:
            if self._needs(rnd, client):
                host.refuse(message, self._leaving_early(client, rnd))
                return
        self.departures.on_shutdown(message)

    def _needs(self, rnd: Round, client: str) -> bool:
        """Whether open ``rnd`` waits for a part of ``client``'s that it has not sent (nor queued), and cannot complete
        without it: not where rounds close by time (a round rule), where the tier drops clients that leave, or where
        the policy completes the round without it."""
        table = self.host.table
        if not rnd.contributions or rnd.forwarding or client in rnd.contributions or table.ahead(rnd, client):
            return False
        awaited = table.awaited(rnd)
        if client not in awaited or table.rule is not None or self.departures.may_drop():
            return False
        return rnd.kind is not Kind.PUSHPULL or not table.policy.round_complete(awaited - {client}, awaited)

    def _leaving_early(self, client: str, rnd: Round) -> str:
        """``client`` says goodbye though ``rnd`` needs it: noted in the run folder; the reason its goodbye is
        refused."""
        host = self.host
        name = host.display(client)
        record_finding(host.config.run_dir, host.name, {"what": LEFT, "kind": rnd.kind.name, "round": rnd.number,
                                                        "clients": [name]})
        return f"{name} is leaving before its part of {rnd.describe()}, which the others wait for"

    def expire(self, round_s: float, request_s: float) -> None:
        """The round table's ``expire`` (the watchdog's, under the lock), and a finding in the run folder for every
        round that timed out waiting for clients: whom it waited for. Why: the first process to exit is a victim,
        a worker whose own wait ran out, while this names the one that stopped sending (``runs.findings``)."""
        table = self.host.table
        due = table.clock() - round_s + 1.0  # (rounds that may time out now; 1 s: more than this call takes)
        before = {rid: (rnd.number, rnd.started_at, sorted(self.host.display(c) for c in table.awaited(rnd)
                                                           - set(rnd.contributions)))
                  for rid, rnd in table.rounds.items() if rnd.contributions and not rnd.forwarding
                  and rnd.started_at < due}
        table.expire(round_s, request_s)
        now = table.clock()
        for rid, (number, started, missing) in before.items():
            mark = (rid[0].name, number, tuple(missing))
            if missing and table.rounds[rid].number != number and now - started > round_s and mark not in self.noted:
                self.noted.add(mark)  # (every slice of a round times out alike: noted once)
                record_finding(self.host.config.run_dir, self.host.name, {"what": MISSING, "kind": mark[0],
                                                                          "round": number, "clients": missing,
                                                                          "waited_s": round_s})

    def close_by_time(self, stop: threading.Event) -> bool:
        """For half a second, every ``RULE_TICK_S``: close the rounds the round rule says are ready by now (the
        watchdog's, where a rule closes rounds by time); True once ``stop`` is set."""
        for _ in range(round(0.5 / RULE_TICK_S)):
            with self.host.lock:
                self.host.table.complete_ready()
            if stop.wait(RULE_TICK_S):
                return True
        return False

    def on_held_pull(self, message: Message) -> None:
        """A request for the job's model as this party holds it (``PullBody.held``; no WAN): answered once no
        overlapped send of the slice is on its way, so that it holds every delta sent so far."""
        sid = (message.key, message.slice)
        if not self.host.aggregation.settled(sid):
            self.held_pulls.setdefault(sid, []).append(message)
            return
        self._answer_held(message)

    def _answer_held_pulls(self, sid: SliceId) -> None:
        for message in self.held_pulls.pop(sid, []):
            self._answer_held(message)

    def _answer_held(self, message: Message) -> None:
        host = self.host
        sid = (message.key, message.slice)
        failure = self.failed_sends.get(sid)
        reply = (message.error(failure) if failure is not None
                 else message.reply(tensor=host.aggregation.held(sid, host.stored[sid].value)))
        host.van.send(message.sender.decode(), reply)

    def answers_early(self) -> bool:
        """Whether this server sends the last party the others' sum early (see geomx.core.early): a HiPS global
        server whose answer is the plain sum of the parties' pushes, as every plug-in in it declares."""
        host = self.host
        topology = host.config.topology
        return (host.is_global and topology.early_answers and topology.mode is Mode.HIPS and host.optimizer is None
                and all_answer_plain_sums(host.table.policy, host.aggregation, host.route) and host.encoding.plain)

    def answer_early(self, rnd: Round, message: Message) -> None:
        """The policy lets this contributor go on before its round completes: the last applied value, sent as
        a completed round's answer would be."""
        host = self.host
        value = host.stored[(rnd.key, rnd.slice)].value
        fields = self._reply_fields(rnd, value)
        host.send(message.sender.decode(), message.reply(**fields) if fields else message.reply(tensor=value))

    def complete(self, rnd: Round) -> None:
        """A round of pushes is complete: send its sum up (a local server) or apply it (a global server)."""
        host = self.host
        assert rnd.accum is not None
        full_sum, rnd.accum = rnd.accum, None
        merged = host.aggregation.merge(rnd) if host.is_global else None
        total = self._rescaled(rnd, full_sum) if merged is None else merged
        if rnd.early is not None and (total is not full_sum or rnd.early not in rnd.contributions
                                      or not self.answers_early()):
            # a client is missing, or the answer is no longer the plain sum (the master set an optimizer or a
            # codec since the early sum left): everyone gets the full answer; the early sum is never used
            rnd.early = None
        elif total is full_sum and len(rnd.contributions) == 1 and self.answers_early():  # (a global server's)
            rnd.early = next(iter(rnd.contributions))  # alone: its answer is its own push (geomx.core.early)
        if host.is_global:
            self._apply(rnd, total)
        else:
            self._send_up(rnd, total)

    def _send_up(self, rnd: Round, total: np.ndarray) -> None:
        """A local server's completed round: what the aggregation sends up, encoded, by the route; answered
        here, with the tier above's answer, or later (see ``Upward``)."""
        host = self.host
        sid = (rnd.key, rnd.slice)
        failure = self.failed_sends.get(sid)
        if failure is not None:  # the tier above lost an overlapped send of this slice: every round says so
            host.release(rnd, None, failure)
            return
        host.aggregation.collected(rnd)
        step = host.aggregation.upward(sid, total)
        match step:
            case AwaitAnswer():  # answered once the tier above answers an earlier overlapped send
                self.waiting[sid] = (rnd, rnd.number)
            case Answer(answer=answer):  # a round the aggregation answers inside the party
                self._answer_here(rnd, answer)
            case SendUp(send=send):
                self._send(rnd, send, answer=None)
            case SendUpAndAnswer(send=send, answer=answer):
                self._send(rnd, send, answer)
            case SendUpAndAwait(send=send):  # answered with what the aggregation makes of the tier above's answer
                self._send(rnd, send, answer=None, awaits=True)
            case _:
                assert_never(step)

    def _send(self, rnd: Round, send: np.ndarray, answer: np.ndarray | None, awaits: bool = False) -> None:
        """Send ``send`` (encoded) up for ``rnd``: through the route, answered with the tier above's answer; or,
        with an ``answer`` now (overlapped), straight to the owner, its answer adopted when it arrives; or,
        ``awaits``, straight to the owner, ``rnd`` answered once its answer is adopted (``Aggregation.resumed``)."""
        host = self.host
        sid = (rnd.key, rnd.slice)
        dtype = host.stored[sid].value.dtype  # what init declared; sums of narrow floats were kept in fp32
        upward = send.astype(dtype, copy=False)
        fields: dict[str, Any] = {"tensor": upward}
        codec = host.encoding.wan_for(upward)
        if codec is not None:
            kind = cast(TensorKind, host.aggregation.push_kind)
            try:
                fields = payload_fields(codec, upward, host.tensor_info(rnd.key, rnd.slice, kind, "push"))
            except CodecError as exc:
                host.release(rnd, None, f"cannot compress key {rnd.key} slice {rnd.slice}: {exc}")
                return
        body = host.aggregation.up_body(sid)
        if body:
            fields["body"] = {**(fields.get("body") or {}), **body}
        first = next(iter(rnd.contributions.values()))
        message = Message(Kind.PUSHPULL, key=rnd.key, slice=rnd.slice, num_slices=first.num_slices, round=rnd.number,
                          priority=first.priority, **fields)
        if answer is not None or awaits:  # overlapped: the contributors go on now, the answer is adopted later
            if answer is not None:
                self._answer_here(rnd, answer)
            else:  # or they wait for it, as for an overlap's due round
                self.waiting[sid] = (rnd, rnd.number)
            host.call(host.owner(rnd.key, rnd.slice), message, lambda result: self._answer_arrived(sid, result))
            return
        if host.route.send_up(rnd, fields):
            return
        host.forward(rnd, message)

    def _answer_here(self, rnd: Round, value: np.ndarray) -> None:
        """Answer ``rnd``'s contributors with ``value`` (in the declared dtype), which the slice now holds."""
        host = self.host
        sid = (rnd.key, rnd.slice)
        value = value.astype(host.stored[sid].value.dtype, copy=False)
        host.stored[sid] = SliceValue(value)
        host.release(rnd, value)

    def _answer_arrived(self, sid: SliceId, result: Future[Message]) -> None:
        """The tier above answered an overlapped send of ``sid`` (under the lock): the aggregation adopts the
        answer, and a round waiting for it is answered. A failure is kept: the waiting round and every later
        round of the slice get its error (the tier above lost this party's contribution; nothing is resent)."""
        host = self.host
        problem = None if result.exception() is None else f"the global server: {result.exception()}"
        if problem is None:
            reply = result.result()
            host.route.answer_arrived(reply)
            try:
                reply.tensor = decode_message(host.codecs, reply)
                problem = host.aggregation.answered(sid, reply)
            except CodecError as exc:
                problem = f"undecodable answer from the global server: {exc}"
            if problem is None and reply.tensor is None:
                problem = "the global server answered without a value"
        waiting = self.waiting.pop(sid, None)
        if problem is not None:
            text = f"key {sid[0]} slice {sid[1]}: an overlapped send failed: {problem}"
            log.error("[%s] %s", host.name, text)
            self.failed_sends[sid] = text
            if waiting is not None:
                host.release(waiting[0], None, text, waiting[1])
            self._answer_held_pulls(sid)
            return
        host.aggregation.adopted(sid, reply.tensor)
        self._answer_held_pulls(sid)
        if waiting is not None:
            rnd, number = waiting
            if host.table.is_current(rnd, number):
                self._answer_here(rnd, host.aggregation.resumed(sid))

    def _apply(self, rnd: Round, total: np.ndarray) -> None:
        """A global server's completed round: the optimizer steps with it (or the aggregation combines it), and
        every contributor gets the answer."""
        host = self.host
        sid = (rnd.key, rnd.slice)
        stored = host.stored[sid]
        dtype = stored.value.dtype
        previous = stored.value
        if host.optimizer is not None:
            try:
                contributor = next(iter(rnd.contributions)) if len(rnd.contributions) == 1 else ""
                gradient = host.aggregation.gradient(total)
                stored.value = host.optimizer.step(sid, stored.value, gradient, contributor).astype(dtype, copy=False)
            except Exception as exc:  # a failing optimizer must not take the server down
                log.exception("[%s] optimizer failed on key %d", host.name, rnd.key)
                host.release(rnd, None, f"optimizer {host.optimizer.name} failed: {exc}")
                return
        else:
            stored.value = host.aggregation.combine(stored.value, total).astype(dtype, copy=False)
        answer = host.aggregation.answer_fields(rnd, stored.value, previous)
        host.release(rnd, stored.value, fields=answer or self._reply_fields(rnd, stored.value))
        if host.checkpoints is not None:  # the values are the model where an optimizer or a model average ran here
            holds = MODEL if host.optimizer is not None or host.aggregation.answers_weights else SUMS
            checkpoint_if_due(host.checkpoints, host.stored, host.table, host.optimizer, holds,
                              every_slice=host.aggregation.rounds_every_slice)

    def _rescaled(self, rnd: Round, total: np.ndarray) -> np.ndarray:
        """After a drop or a departure: the sum as the tier's policy applies it, given the workers behind the
        round's contributions and the tier's (FSA scales it to the full tier; others apply it as it is)."""
        host = self.host
        full = host.config.topology.num_all_workers if host.is_global else host.config.num_workers
        behind = [self._workers_behind(c) for c in rnd.contributions]
        if None in behind:  # a launch without a topology file: the other parties' sizes are unknown, all alike
            present = full * len(behind) // max(len(host.clients.present), len(behind))
        else:
            present = sum(n for n in behind if n is not None)
        return host.table.policy.rescale(total, present, full)

    def _workers_behind(self, client: str) -> int | None:
        """Workers a client speaks for: its party's (a local server's pushes to a global server), else 1; None
        where the topology does not know the party's size (GeoMX-style DMLC_* launches name placeholders)."""
        host = self.host
        party = host.clients.parties.get(client) or host.van.peer_party(client)
        topology = host.config.topology
        if host.is_global and topology.mode is Mode.HIPS and party is not None:
            if not topology.parties_known:
                return None
            return topology.party(party).num_workers
        return 1

    def _reply_fields(self, rnd: Round, value: np.ndarray) -> dict[str, Any] | None:
        """The global server's answer, compressed when a WAN codec is set (None: the plain value).

        An aggregate of gradients is additive, so residual codecs may sparsify it, keeping what they hold back
        for later rounds. Weights (after a server optimizer, or an aggregation that answers with the model)
        are not: they travel with stateless codecs or dense.
        """
        host = self.host
        codec = host.encoding.wan_for(value)
        if codec is None:
            return None
        weights = host.optimizer is not None or host.aggregation.answers_weights
        kind: TensorKind = "weights" if weights else "gradient"
        try:
            return payload_fields(codec, value, host.tensor_info(rnd.key, rnd.slice, kind, "pull"))
        except CodecError as exc:
            if kind != "weights":
                raise
            log.debug("[%s] key %d is sent dense: %s", host.name, rnd.key, exc)
            return None
