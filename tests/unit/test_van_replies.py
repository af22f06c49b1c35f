"""The van's reply hook: a reply is handed to its requester on the I/O thread (one thread hop less per request),
but never ahead of a message received before it that the dispatch thread has not finished (an early sum that the
reply settles must be stored first)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from geomx.config import PartySpec, Topology
from geomx.protocol.wire import Kind, Message
from geomx.transport.dispatch import Inbox
from geomx.transport.rpc import Requests
from geomx.transport.van import Van

WAIT = 10.0


def _topology() -> Topology:
    return Topology(parties=(PartySpec("a", 2),), central="a")


@pytest.fixture
def vans() -> Iterator[list[Van]]:
    made: list[Van] = []
    yield made
    for van in reversed(made):
        van.stop(flush_timeout=1.0)


def _pair(vans: list[Van], handler) -> tuple[Van, Van]:
    """``requester`` (handler ``handler``) and ``peer`` (ignores what it gets), connected both ways."""
    requester = Van("requester", party="a", topology=_topology(), handler=handler)
    peer = Van("peer", party="a", topology=_topology(), handler=lambda message: None)
    for van in (requester, peer):
        vans.append(van)
        van.start()
    requester.add_peer("peer", peer.address, party="a")
    peer.add_peer("requester", requester.address, party="a")
    return requester, peer


def test_a_reply_is_taken_on_the_io_thread_when_nothing_waits(vans):
    handled: list[Message] = []
    hooked: list[tuple[Message, str]] = []
    got = threading.Event()
    requester, peer = _pair(vans, handled.append)

    def hook(message: Message) -> bool:
        hooked.append((message, threading.current_thread().name))
        got.set()
        return True

    requester.reply_hook = hook
    peer.send("requester", Message(Kind.PUSHPULL, key=3, request_id=7).reply())
    assert got.wait(WAIT)
    (message, thread), = hooked
    assert (message.key, message.request_id, message.is_reply) == (3, 7, True)
    assert thread.endswith("-io")  # not the dispatch thread: no hop to it
    assert handled == []


def test_a_reply_never_overtakes_an_earlier_message_still_handled(vans):
    """The early sum arrives first and its handling is slow; the round's answer comes meanwhile: the hook must not
    take it (it would settle the round before the early sum is stored); it reaches the handler after the sum."""
    order: list[str] = []
    release, started, done = threading.Event(), threading.Event(), threading.Event()

    def handler(message: Message) -> None:
        if not message.is_reply:
            started.set()
            assert release.wait(WAIT)
        order.append("reply" if message.is_reply else "early")
        if len(order) == 2:
            done.set()

    requester, peer = _pair(vans, handler)
    requester.reply_hook = lambda message: order.append("hooked") is None
    peer.send("requester", Message(Kind.PUSHPULL, key=1))  # not a reply: the dispatch thread's
    assert started.wait(WAIT)
    peer.send("requester", Message(Kind.PUSHPULL, key=1, request_id=5).reply())
    deadline = time.monotonic() + WAIT  # until the reply is in: queued behind the early sum, or (wrongly) hooked
    while requester._inbox.put_count < 2 and "hooked" not in order and time.monotonic() < deadline:
        time.sleep(0.005)
    release.set()
    assert done.wait(WAIT)
    assert order == ["early", "reply"]


def test_the_inbox_counts_what_it_was_given_and_what_was_handled():
    inbox = Inbox()
    assert inbox.idle()
    inbox.put(Message(Kind.PUSHPULL))
    inbox.put(None)  # the van stopping: not a message to handle
    assert not inbox.idle()
    inbox.handled_count += 1
    assert inbox.idle()


def test_a_reply_to_a_cancelled_request_is_taken_without_raising():
    """On the I/O thread (the reply hook) a raise would end the van's I/O loop: a future its waiter cancelled is
    left as it is."""

    class Quiet:
        def send(self, peer: str, message: Message) -> None:
            pass

    requests = Requests(Quiet())  # type: ignore[arg-type]
    future = requests.call("peer", Message(Kind.PUSHPULL, key=2))
    assert future.cancel()
    reply = Message(Kind.PUSHPULL, key=2, request_id=future_id(requests)).reply()
    reply.sender = b"peer"
    assert requests.resolve(reply)
    assert future.cancelled()


def future_id(requests: Requests) -> int:
    """The id of the one request waiting."""
    (request_id,) = list(requests._pending)
    return request_id
