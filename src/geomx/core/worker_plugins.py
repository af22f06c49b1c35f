"""The interfaces the worker core owns for what plugs into a worker (the server's are in ``geomx.core.plugins``).

A *push route* decides how one slice's push travels to the round and how the round's value comes back; this
base class is the direct route (one PUSHPULL request to the slice's server, the value in its reply). A *step
assigner* tells a worker how many local steps to run before the next average. ``kv.py`` holds one of each,
built by ``geomx.worker.compose`` from the typed config; it never asks which one it holds.

Usage::

    class Overlay(PushRoute):
        copies = True
        def push(self, server, message): ...; return future    # resolves with the round's value
        def handles(self, message): return message.kind == OVERLAY   # OVERLAY = PluginKind(40, "overlay")
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass

from ..cluster.membership import AddressBook, Member
from ..protocol.wire import Message
from ..transport.rpc import Requests
from ..transport.van import Van


@dataclass
class WorkerContext:
    """What a worker plug-in may use: the worker's van and requests, its servers, the book it joined with."""

    van: Van
    requests: Requests
    servers: list[str]  # the servers this worker pushes to: its party's local server, or the global servers
    book: AddressBook
    me: Member
    timeout: float  # how long a request waits for its answer (the topology's request timeout)


class PushRoute:
    """How a worker's push of one slice travels. This base is the direct route: a PUSHPULL request to the
    slice's server, answered with the round's value."""

    # True: the route copies a pushed tensor itself before ``push`` returns, so the caller need not snapshot it
    copies = False
    # False: the route carries plain tensors only (it sums them on their way), never a codec's payload
    carries_codecs = True

    def __init__(self, context: WorkerContext) -> None:
        self._context = context

    def push(self, server: str, message: Message) -> Future[Message]:
        """Send ``message`` (a PUSHPULL of one slice, for ``server``); the future resolves with the round's value."""
        return self._context.requests.call(server, message)

    def push_together(self, server: str, messages: Sequence[Message]) -> list[Future[Message]]:
        """Send ``messages`` (PUSHPULLs of slices ``server`` holds) as few messages as fit (``Requests.call_together``:
        BUNDLEs); one future per message. A route that sends pushes its own way (overrides ``push``) sends them one
        by one through it."""
        if type(self).push is not PushRoute.push:
            return [self.push(server, message) for message in messages]
        return self._context.requests.call_together(server, messages)

    def handles(self, message: Message) -> bool:
        """Take ``message`` if it belongs to the route (True), before the worker matches it to a request."""
        return False


class StepAssigner:
    """How many local steps a worker runs before the next average, from its measured time per step."""

    def assign(self, seconds_per_step: float, base_steps: int) -> int:
        """This worker's local steps for the next round (a collective call: every worker makes it)."""
        raise NotImplementedError
