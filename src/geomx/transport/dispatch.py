"""The van's dispatch thread: hand each received message to the node's handler, one at a time, so a slow
handler never stops the I/O thread from moving bytes; a handler that fails answers the request with an ERROR.

Usage (the van's dispatch thread runs)::

    dispatch(name, inbox, handler, io_thread, stopping, send=van.send, peers=van_peers)
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


def dispatch(name: str, inbox: queue.SimpleQueue[Message | Delivery | None], handler: Callable[[Message], None],
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
        if not isinstance(message, Message):  # a DGT datagram that passed the ingress
            try:
                message()
            except Exception:
                log.exception("[%s] DGT datagram handler failed", name)
            continue
        try:
            handler(message)
        except Exception as exc:  # a bad message must never kill the node
            log.exception("[%s] handler failed on %s from %r", name, message.kind.name, message.sender)
            sender = message.sender.decode()
            if not message.is_reply and message.kind is not Kind.ERROR and sender in peers:
                send(sender, message.error(f"{name}: {type(exc).__name__}: {exc}"))
