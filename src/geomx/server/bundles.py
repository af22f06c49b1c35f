"""Bundles: several PUSHPULLs of one client to this server as one message (``Kind.BUNDLE``), answered as one.

A collective party's rank sends the slices it owns of one bucket for one global server as a bundle
(``Requests.call_together``): messages, not bytes, bound such a step. Here a bundle is split into its parts, and
each part goes through the server's normal dispatch (``ParameterServer._handle``: the client checks, a rejoiner's
hold, the codec, the route, the slice's round) as if it had come alone, so the per-slice round machinery stays the
one source of truth (a job may mix collective parties and parties with a local server). Each part gets a request
id of this server's own (``PART_IDS``), so its answer, whoever sends it (a round's release, a refusal, a policy's
early answer), is recognised on its way out (``sending``) and kept, its own request id restored; once every part
has its answer the bundle is answered in one message, its parts in the bundle's order.

Early answers (``geomx.core.early``): an early sum goes to a slice's owning rank as its own message, and the
round's bare answer, which settles it, comes later in the bundle's reply. Both leave the server's priority queue
toward the same rank (``geomx.transport.links``: highest priority first, in order within one priority), so the
bundle's reply travels at the lowest priority of its parts and of every early sum of their rounds (sent before the
bundle came or while it is open): it never overtakes an early sum it settles.

Usage (inside the server, under its lock)::

    bundles = Bundles(server._handle, van.send)
    handlers[Kind.BUNDLE] = bundles.on_bundle
    if bundles.sending(peer, message): return       # a part's answer: kept for the bundle's reply
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

from ..core.early import EarlyAnswers
from ..protocol.wire import Flag, Kind, Message

PART_IDS = 1 << 63  # the request ids this server gives a bundle's parts: above any a client's counter reaches


@dataclass
class _Open:
    """A bundle some of whose parts wait for their answers."""

    sender: str
    request_id: int
    priority: int
    answers: list[Message | None]
    left: int


class Bundles:
    """The bundles a server has split and not answered yet (see the module docstring)."""

    def __init__(self, dispatch: Callable[[Message], None], send: Callable[[str, Message], None]) -> None:
        self.dispatch = dispatch  # the server's dispatch of one message, as if it had come alone
        self.send = send  # the way out that no part's answer takes: the van's
        self._ids = itertools.count(1)
        self.parts: dict[tuple[str, int], tuple[_Open, int, int]] = {}  # (sender, part id): bundle, index, own id
        self.slices: dict[tuple[str, int, int], _Open] = {}  # (sender, key, slice) of a part waiting: its bundle
        self.early: dict[tuple[str, int, int], int] = {}  # (client, key, slice) sent an early sum: at what priority

    def on_bundle(self, message: Message) -> None:
        """A client's bundle (decoded: ``geomx.protocol.wire`` checked its parts): each part dispatched alone."""
        sender = message.sender.decode()
        parts = message.parts or []
        bundle = _Open(sender, message.request_id, message.priority, [None] * len(parts), len(parts))
        for index, part in enumerate(parts):
            own, part.request_id = part.request_id, PART_IDS | next(self._ids)
            part.sender = message.sender
            self.parts[(sender, part.request_id)] = (bundle, index, own)
            self.slices[(sender, part.key, part.slice)] = bundle
            early = self.early.get((sender, part.key, part.slice))  # sent before the bundle came: still queued?
            if early is not None:
                bundle.priority = min(bundle.priority, early)
        for part in parts:
            self.dispatch(part)

    def sending(self, peer: str, message: Message) -> bool:
        """``message`` is about to go to ``peer``: True if it answers a bundle's part (kept; the bundle is answered
        once every part is). An early sum goes (False), and keeps the reply of a bundle with its slice behind it."""
        where = (peer, message.key, message.slice)
        if not message.is_reply:
            if EarlyAnswers.is_early(message):
                self.early[where] = message.priority
                bundle = self.slices.get(where)
                if bundle is not None:
                    bundle.priority = min(bundle.priority, message.priority)
            return False
        self.early.pop(where, None)  # the round's answer: its early sum, if any, is settled
        entry = self.parts.pop((peer, message.request_id), None)
        if entry is None:
            return False
        bundle, index, own = entry
        if self.slices.get(where) is bundle:
            del self.slices[where]
        message.request_id = own
        bundle.answers[index] = message
        bundle.left -= 1
        if bundle.left == 0:
            answers = [answer for answer in bundle.answers if answer is not None]
            self.send(peer, Message(Kind.BUNDLE, request_id=bundle.request_id, priority=bundle.priority,
                                    flags=Flag.REPLY, parts=answers))
        return True

    def __len__(self) -> int:
        """Open bundles' parts still waiting for their answers."""
        return len(self.parts)
