"""Request tracking: every request gets an id and a future; replies and errors resolve it.

Usage::

    requests = Requests(van)
    future = requests.call("dc1/server", Message(Kind.PULL, key=3))
    reply = requests.wait(future, timeout=30, what="PULL key 3 from dc1/server")
    futures = requests.call_together("global_server/0", pushes)   # as few BUNDLEs as fit; one future per push
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

from ..protocol.wire import Kind, Message, bundled
from .van import Van


class RemoteError(RuntimeError):
    """A peer answered a request with an error (the text says who and why)."""


class RequestTimeout(TimeoutError):
    """No answer within the configured timeout; the text names the peer and the request."""


class Requests:
    """Outstanding requests of one node, keyed by request id."""

    def __init__(self, van: Van, names: dict[str, str] | None = None) -> None:
        self._van = van
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[str, Future[Message]]] = {}
        self._lock = threading.Lock()
        self.names = names if names is not None else {}
        self._dead: dict[str, str] = {}  # peers declared dead (by heartbeats): requests to them fail at once
        self._self_dead: str | None = None  # this node was declared dead: every request fails at once

    def display(self, peer: str) -> str:
        """``peer``'s name for logs and errors: its node name once known, else its identity, escaped (``ascii``)
        where it holds what a terminal would not print (a stray or malicious client's raw socket identity).

        Usage: ``log.info("%s left", requests.display(peer))``"""
        name = self.names.get(peer, peer)
        return name if name.isprintable() else ascii(name)

    def call(self, peer: str, message: Message) -> Future[Message]:
        """Send ``message`` to ``peer`` as a new request; the future resolves with the reply."""
        future: Future[Message] = Future()
        with self._lock:
            message.request_id = next(self._ids)
            dead = self._self_dead or self._dead.get(peer)
            if dead is None:
                self._pending[message.request_id] = (peer, future)
        if dead is not None:
            future.set_exception(RemoteError(dead))
            return future
        self._van.send(peer, message)
        return future

    def call_together(self, peer: str, messages: Sequence[Message]) -> list[Future[Message]]:
        """Send ``messages`` (PUSHPULLs) to ``peer`` as one BUNDLE per run ``bundled`` cuts them into (a run of one
        as itself, by ``call``); one future per message, resolved with its own answer or failed with its own
        refusal, as ``call``'s would be. A bundle travels at the lowest priority of its parts."""
        futures: list[Future[Message]] = []
        for run in bundled(messages):
            if len(run) == 1:
                futures.append(self.call(peer, run[0]))
                continue
            parts: list[Future[Message]] = [Future() for _ in run]
            with self._lock:
                for message in run:
                    message.request_id = next(self._ids)
            bundle = self.call(peer, Message(Kind.BUNDLE, priority=min(m.priority for m in run), parts=list(run)))
            bundle.add_done_callback(lambda done, run=run, parts=parts: self._split(peer, run, parts, done))
            futures += parts
        return futures

    def _split(self, peer: str, run: list[Message], parts: list[Future[Message]], done: Future[Message]) -> None:
        """A bundle's answer, or its failure, handed to each part's future."""
        name = self.display(peer)
        error = done.exception()
        answers: list[Message] = []
        if error is None:
            reply = done.result()
            answers = reply.parts or []
            if reply.kind is not Kind.BUNDLE or [a.request_id for a in answers] != [m.request_id for m in run]:
                error = RemoteError(f"{name} answered a bundle of {len(run)} requests with {len(answers)} answers "
                                    "that are not theirs")
            for answer in answers:
                answer.sender = reply.sender
        for index, future in enumerate(parts):
            if error is not None:
                if not future.done():
                    future.set_exception(error)
            else:
                self._settle(future, answers[index], name)

    def resolve(self, message: Message) -> bool:
        """Complete the request this reply answers. False if it answers nothing we wait for.

        Only the peer the request went to can answer it: a reply with a known id from anyone else is ignored.
        """
        if not message.is_reply:
            return False
        sender = message.sender.decode(errors="replace")
        with self._lock:
            entry = self._pending.get(message.request_id)
            if entry is None or entry[0] != sender:  # unknown id, or an answer from someone we did not ask
                return False
            del self._pending[message.request_id]
        peer, future = entry
        self._settle(future, message, self.display(peer))
        return True

    @staticmethod
    def _settle(future: Future[Message], answer: Message, name: str) -> None:
        """A request's ``answer`` from ``name`` into its future: the message, or an ERROR's text as a RemoteError;
        a future its waiter cancelled is left alone (setting it would raise InvalidStateError)."""
        if future.done():
            return
        if answer.kind is Kind.ERROR:
            text = (answer.body or {}).get("error", "unspecified error")
            future.set_exception(RemoteError(f"{name} refused the request: {text}"))
        else:
            future.set_result(answer)

    def fail_all(self, reason: str) -> None:
        """Fail every outstanding request (used when the node shuts down)."""
        with self._lock:
            pending, self._pending = self._pending, {}
        for peer, future in pending.values():
            if not future.done():
                future.set_exception(RemoteError(f"request to {self.display(peer)} abandoned: {reason}"))

    def fail_peer(self, peer: str, reason: str) -> None:
        """``peer`` is dead: fail its outstanding requests, and every later one at once, with ``reason``."""
        with self._lock:
            self._dead[peer] = reason
            mine = [rid for rid, (to, _) in self._pending.items() if to == peer]
            futures = [self._pending.pop(rid)[1] for rid in mine]
        for future in futures:
            if not future.done():
                future.set_exception(RemoteError(reason))

    def fail_everything(self, reason: str) -> None:
        """This node was declared dead: fail every outstanding request, and every later one at once."""
        with self._lock:
            self._self_dead = reason
            pending, self._pending = self._pending, {}
        for _, future in pending.values():
            if not future.done():
                future.set_exception(RemoteError(reason))

    def wait(self, future: Future[Message], timeout: float, what: str) -> Message:
        """The reply, or RequestTimeout naming ``what`` after ``timeout`` seconds."""
        try:
            return future.result(timeout=timeout)
        except FutureTimeout:
            raise RequestTimeout(f"timed out after {timeout:g} s waiting for {what}") from None

    def __len__(self) -> int:
        return len(self._pending)
