"""A worker's part in TSEngine inside a party (``ENABLE_INTRA_TS``): hold a push until the local server says
where it goes, merge a fellow worker's push into it, take the round's value from whoever relays it, and pass
that value on when told.

The local server coordinates (see ``rules.py`` and ``ParameterServer._ts_coordinate``). A push goes:

1. the worker keeps its tensor and sends RELAY ``{"ask": true}`` to its local server;
2. the server answers RELAY ``{"push": "server"}`` (send it to me) or ``{"push": "peer", "to": W}`` (add it to
   W's, which asks again). Either way the worker sends the server a PUSHPULL: with the tensor, or with
   ``{"ts_merged": W}`` and no tensor, so that the server's round counts it;
3. the server answers that PUSHPULL without a value (``{"ts": "relayed"}``); the value comes as a RELAY with
   a tensor from the server or from a fellow worker. The worker acks it to the server, which may then tell it
   (RELAY ``{"to": W}``) to pass its copy to another worker.

Usage::

    member = RelayMember(van, requests, server="dc0/server/ab12", peers={"dc0/worker/cd34"}, name="dc0/worker0")
    future = member.push(key=3, index=0, num_slices=1, data=grad, priority=-3)   # resolves with the value
    van handler: if member.handles(message): return
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np

from ...protocol.wire import Kind, Message, SliceId
from ...transport.rpc import RemoteError, Requests
from ...transport.van import Van
from .kinds import RELAY

log = logging.getLogger("geomx.algorithms.tsengine.member")


@dataclass
class _Held:
    """A push waiting for its instruction (it may grow: fellow workers' pushes merge into it)."""

    total: np.ndarray
    num_slices: int
    priority: int


class RelayMember:
    """One worker's held pushes, awaited values and last values (to relay). Thread-safe."""

    def __init__(self, van: Van, requests: Requests, server: str, peers: set[str], name: str) -> None:
        self._van = van
        self._requests = requests
        self._server = server
        self._peers = set(peers)
        self._name = name
        self._lock = threading.Lock()
        self._held: dict[SliceId, _Held] = {}
        self._awaiting: dict[SliceId, Future[Message]] = {}
        self._received: dict[SliceId, Message] = {}

    def push(self, key: int, index: int, num_slices: int, data: np.ndarray, priority: int) -> Future[Message]:
        """Hold ``data`` (copied) and ask where it goes; the future resolves with the round's value."""
        sid = (key, index)
        future: Future[Message] = Future()
        with self._lock:
            if sid in self._awaiting:
                raise RuntimeError(f"push of key {key} slice {index}: the previous push of this key is still being "
                                   "aggregated; pull it first")
            self._held[sid] = _Held(np.array(data, copy=True), num_slices, priority)
            self._awaiting[sid] = future
        self._van.send(self._server, Message(RELAY, key=key, slice=index, num_slices=num_slices,
                                             priority=priority, body={"ask": True}))
        return future

    def handles(self, message: Message) -> bool:
        """Take ``message`` if it is TSEngine's (a RELAY, or the server refusing one); False otherwise."""
        sender = message.sender.decode(errors="replace")
        if message.kind is Kind.ERROR and message.is_reply and message.request_id == 0 and sender == self._server:
            text = (message.body or {}).get("error", "unspecified error")
            self._fail((message.key, message.slice), RemoteError(f"the local server refused TSEngine: {text}"))
            return True
        if message.kind != RELAY:  # a received kind is a new int: never ``is``
            return False
        body = message.body or {}
        if sender == self._server and "push" in body:
            self._send_held(message, body.get("to"))
        elif sender in self._peers and body == {"merge": True}:
            self._merge(message)
        elif sender == self._server and "to" in body:
            self._pass_on(message, body["to"])
        elif (sender == self._server or sender in self._peers) and message.tensor is not None:
            self._take_value(message)
        else:
            log.warning("[%s] unexpected RELAY %s from %s for key %d slice %d", self._name, sorted(body), sender,
                        message.key, message.slice)
        return True

    # -- the steps ----------------------------------------------------------------------------------------
    def _send_held(self, instruction: Message, peer: object) -> None:
        """The server's instruction: our held sum to the server (``peer`` None) or into ``peer``'s."""
        sid = (instruction.key, instruction.slice)
        with self._lock:
            held = self._held.pop(sid, None)
        if held is None:
            log.error("[%s] told to push key %d slice %d, but no push of it is held", self._name, *sid)
            return
        push = Message(Kind.PUSHPULL, key=sid[0], slice=sid[1], num_slices=held.num_slices, priority=held.priority)
        if isinstance(peer, str) and peer in self._peers:
            self._van.send(peer, Message(RELAY, key=sid[0], slice=sid[1], num_slices=held.num_slices,
                                         priority=held.priority, tensor=held.total, body={"merge": True}))
            push.body = {"ts_merged": peer}
        else:
            push.tensor = held.total
        self._requests.call(self._server, push).add_done_callback(
            lambda done: self._fail(sid, done.exception()) if done.exception() is not None else None)

    def _merge(self, message: Message) -> None:
        """A fellow worker's sum: add it to ours and ask again."""
        sid = (message.key, message.slice)
        with self._lock:
            held = self._held.get(sid)
            if held is not None and message.tensor is not None and message.tensor.size == held.total.size:
                np.add(held.total, message.tensor.reshape(held.total.shape), out=held.total)
                ask = Message(RELAY, key=sid[0], slice=sid[1], num_slices=held.num_slices, priority=held.priority,
                              body={"ask": True})
            else:
                ask = None
        if ask is None:
            log.error("[%s] a merge of key %d slice %d from %s matches no held push of that size", self._name, *sid,
                      message.sender.decode(errors="replace"))
            return
        self._van.send(self._server, ask)

    def _take_value(self, message: Message) -> None:
        """The round's value: keep it (we may be told to relay it), ack it, answer our pull."""
        sid = (message.key, message.slice)
        with self._lock:
            self._received[sid] = message
            future = self._awaiting.pop(sid, None)
        self._van.send(self._server, Message(RELAY, key=sid[0], slice=sid[1], num_slices=message.num_slices,
                                             round=message.round, body={"ack": True}))
        if future is None:
            log.warning("[%s] a value of key %d slice %d arrived that no push awaits", self._name, *sid)
        elif not future.done():
            future.set_result(message)

    def _pass_on(self, instruction: Message, target: object) -> None:
        sid = (instruction.key, instruction.slice)
        with self._lock:
            value = self._received.get(sid)
        if value is None or not isinstance(target, str) or target not in self._peers:
            log.error("[%s] cannot relay key %d slice %d to %r", self._name, *sid, target)
            return
        self._van.send(target, Message(RELAY, key=sid[0], slice=sid[1], num_slices=value.num_slices,
                                       round=instruction.round, tensor=value.tensor))

    def _fail(self, sid: SliceId, error: BaseException | None) -> None:
        with self._lock:
            future = self._awaiting.pop(sid, None)
            self._held.pop(sid, None)
        if future is not None and error is not None and not future.done():
            future.set_exception(error)
