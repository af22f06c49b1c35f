"""The van's dispatch thread: hand each received message to the node's handler, one at a time, so a slow
handler never stops the I/O thread from moving bytes; a handler that fails answers the request with an ERROR.

The ``Inbox`` counts what it was given and what the handler finished: while both counts match, nothing received
earlier waits or is being handled, so the I/O thread may hand a reply to its requester itself (``Van.reply_hook``)
without overtaking an earlier message from the same peer (an early sum that the reply settles).

Usage (the van's dispatch thread runs)::

    inbox = Inbox()
    dispatch(name, inbox, handler, io_thread, stopping, send=van.send, peers=van_peers)
    inbox.idle()        # on the I/O thread: True when every message put so far has been handled
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Container

from ..protocol.wire import Kind, Message
from .links import Delivery

log = logging.getLogger("geomx.transport.van")

DISPATCH_POLL_S = 1.0  # how often an idle dispatch thread checks that the I/O thread still delivers


class Inbox:
    """The dispatch thread's queue, with two counts: the items put (by the I/O thread alone) and the items handled
    (by the dispatch thread alone), each written by one thread, so comparing them needs no lock."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Message | Delivery | None] = queue.SimpleQueue()
        self.put_count = 0
        self.handled_count = 0

    def put(self, item: Message | Delivery | None) -> None:
        """Queue ``item`` for the handler; None (the van stopping, from any thread) is not counted."""
        if item is not None:
            self.put_count += 1
        self._queue.put(item)

    def get(self, timeout: float) -> Message | Delivery | None:
        return self._queue.get(timeout=timeout)

    def idle(self) -> bool:
        """Whether every item put so far has been handled (read on the I/O thread, the only one that puts)."""
        return self.put_count == self.handled_count


def dispatch(name: str, inbox: Inbox, handler: Callable[[Message], None],
             io: threading.Thread, stopping: threading.Event, send: Callable[[str, Message], None],
             peers: Container[str]) -> None:
    """Run ``handler`` on every message of ``inbox`` (and every passed DGT datagram's delivery) until a None
    arrives, the van stops, or the I/O thread ``io`` has ended. Errors are logged and answered, never raised."""
    while True:
        try:  # bounded: an I/O thread that died would leave this thread waiting for messages forever
            message = inbox.get(timeout=DISPATCH_POLL_S)
        except queue.Empty:
            if stopping.is_set():
                return
            if not io.is_alive():
                log.error("[%s] stopped waiting for messages to handle: the I/O thread has ended", name)
                return
            continue
        if message is None:
            return
        try:
            _handle(name, message, handler, send, peers)
        finally:
            inbox.handled_count += 1


def _handle(name: str, message: Message | Delivery, handler: Callable[[Message], None],
            send: Callable[[str, Message], None], peers: Container[str]) -> None:
    """One item of the inbox: a message to the handler, or a passed DGT datagram's delivery."""
    if not isinstance(message, Message):  # a DGT datagram that passed the ingress
        try:
            message()
        except Exception:
            log.exception("[%s] DGT datagram handler failed", name)
        return
    try:
        handler(message)
    except Exception as exc:  # a bad message must never kill the node
        log.exception("[%s] handler failed on %s from %r", name, message.kind.name, message.sender)
        sender = message.sender.decode()
        if not message.is_reply and message.kind is not Kind.ERROR and sender in peers:
            send(sender, message.error(f"{name}: {type(exc).__name__}: {exc}"))
