"""Requests: a reply to a request whose waiter cancelled its future is taken without raising."""

from __future__ import annotations

from geomx.protocol.wire import Kind, Message
from geomx.transport.rpc import Requests


def test_a_reply_to_a_cancelled_request_is_taken_without_raising():
    """A future its waiter cancelled is left as it is (setting it would raise InvalidStateError in the van's thread
    that resolves it)."""

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
