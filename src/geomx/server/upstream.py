"""One tier up: a server's requests to the servers above it (a party's local server to the global servers).

A completed round's reduction goes to the global server that owns its slice (``forward``); the round is
released with the answer, or earlier with the others' sum plus ours when the global server sends it ahead
(``geomx.core.early``). Pulls and stats go the same way. Every callback runs under the server lock.

Usage (the server's host methods and handlers)::

    upstream = Upstream(server, held=pushpulls.on_held_pull)
    upstream.forward(rnd, Message(Kind.PUSHPULL, key=rnd.key, slice=rnd.slice, tensor=total))
    handlers[Kind.PULL] = upstream.on_pull
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future

import numpy as np

from ..codecs import CodecError
from ..codecs.messages import decode_message
from ..core.rounds import Round, SliceValue
from ..protocol.bodies import BodyError, PullBody, decode_body
from ..protocol.wire import Kind, Message
from .host import PartHost

log = logging.getLogger("geomx.server")


class Upstream:
    """A server's requests to the tier above (see the module docstring)."""

    def __init__(self, host: PartHost, held: Callable[[Message], None]) -> None:
        self.host = host
        self.held = held  # answers a request for the job's model as this party holds it (PushPulls.on_held_pull)

    def forward(self, rnd: Round, message: Message) -> None:
        """Send this round's reduction to the owning global server; release the round with its answer."""
        host = self.host
        owner = host.owner(rnd.key, rnd.slice)
        future = host.requests.call(owner, message)
        number = rnd.number
        if message.kind is Kind.PUSHPULL and message.tensor is not None and message.encoded is None:
            # plain sums: if the global server sends the others' sum early, answer with it plus ours at once
            host.early_answers.forwarded(owner, rnd.key, rnd.slice, message.tensor,
                                         lambda value: self._adopt(rnd, number, value))

        def done(result: Future[Message]) -> None:
            with host.lock:
                self._answered(rnd, number, owner, result)

        future.add_done_callback(done)

    def _answered(self, rnd: Round, number: int, owner: str, result: Future[Message]) -> None:
        """The owner answered round ``number`` of ``rnd`` (under the lock): decode, adopt, release."""
        host = self.host
        error = result.exception()
        if error is not None:
            host.release(rnd, None, str(error), number)
            return
        reply = result.result()
        host.route.answer_arrived(reply)
        if host.route.answered_elsewhere(reply):
            return
        try:
            if host.early_answers.settled(owner, reply):
                return  # answered already, with the early sum (geomx.core.early)
        except ValueError as exc:
            host.stop_fatally(f"{host.name}: {exc}")
            return
        try:
            reply.tensor = decode_message(host.codecs, reply)
        except CodecError as exc:
            host.release(rnd, None, f"undecodable answer from the global server: {exc}", number)
            return
        problem = host.aggregation.answered((rnd.key, rnd.slice), reply)
        if problem:
            host.release(rnd, None, problem, number)
            return
        if reply.tensor is not None and rnd.number == number and rnd.forwarding:
            host.stored[(rnd.key, rnd.slice)] = SliceValue(reply.tensor)
            host.aggregation.adopted((rnd.key, rnd.slice), reply.tensor)
        host.release(rnd, reply.tensor, None, number)

    def _adopt(self, rnd: Round, number: int, value: np.ndarray) -> None:
        """Round ``number`` of ``rnd`` is the others' sum plus ours: adopt it and answer the workers now (in the
        declared dtype, as the global server stores it: narrow floats are summed in float32, then cast back)."""
        host = self.host
        value = value.astype(host.stored[(rnd.key, rnd.slice)].value.dtype, copy=False)
        if rnd.number == number and rnd.forwarding:
            host.stored[(rnd.key, rnd.slice)] = SliceValue(value)
            host.aggregation.adopted((rnd.key, rnd.slice), value)
        host.release(rnd, value, None, number)

    def when_all(self, futures: list[Future[Message]], then: Callable[[str | None], None]) -> None:
        """Call ``then(error_text_or_None)`` once every future is done (under the server lock)."""
        host = self.host
        remaining = [len(futures)]

        def one_done(_: Future[Message]) -> None:
            with host.lock:
                remaining[0] -= 1
                if remaining[0]:
                    return
                errors = [str(f.exception()) for f in futures if f.exception() is not None]
                then("; ".join(errors) if errors else None)

        if not futures:
            then(None)
        for future in futures:
            future.add_done_callback(one_done)

    def on_pull(self, message: Message) -> None:
        """The current value. A local server asks its global server: its own copy may be stale (the global tier
        need not be synchronous); asked for what it holds (``PullBody.held``), it answers the job's model as the
        aggregation says the party holds it."""
        host = self.host
        stored = host.stored.get((message.key, message.slice))
        sender = message.sender.decode()
        if stored is None:
            host.refuse(message, f"key {message.key} slice {message.slice} was never initialized; call init first")
            return
        try:
            held = message.body is not None and decode_body(PullBody, message.body).held
        except BodyError as exc:
            host.refuse(message, str(exc))
            return
        if held and not host.is_global:  # the job's model as this party holds it: no WAN
            self.held(message)
            return
        if host.is_global:
            if host.optimizer is not None:  # an optimizer may compensate the puller's next push against these
                # (a collective party's rank pulls for its party: the client its pushes count as)
                host.optimizer.received((message.key, message.slice), host.clients.client_of(sender), stored.value)
            host.van.send(sender, message.reply(tensor=stored.value))
            return
        owner = host.owner(message.key, message.slice)
        future = host.requests.call(owner, Message(Kind.PULL, key=message.key, slice=message.slice,
                                                   num_slices=message.num_slices, priority=message.priority))

        def answer(result: Future[Message]) -> None:
            error = result.exception()
            reply = message.error(f"{host.name}: {error}") if error else message.reply(tensor=result.result().tensor)
            host.van.send(sender, reply)

        future.add_done_callback(answer)

    def on_stats(self, message: Message) -> None:
        """Our counters; a local server adds its global servers' under "upstream"."""
        host = self.host
        sender = message.sender.decode()
        if not host.van.knows(sender):
            return
        own = {"name": host.name, "role": host.config.role.value, **host.van.counters.snapshot()}
        if host.is_global:
            host.van.send(sender, message.reply(body=own))
            return
        futures = [host.requests.call(gs, Message(Kind.STATS)) for gs in host.upstream]

        def answer(error: str | None) -> None:
            if error:
                host.van.send(sender, message.error(error))
                return
            upstream = {}
            for future in futures:
                body = future.result().body or {}
                upstream[str(body.get("name"))] = body
            host.van.send(sender, message.reply(body={**own, "upstream": upstream}))

        self.when_all(futures, answer)
