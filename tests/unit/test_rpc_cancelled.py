"""Requests: a reply to a request whose waiter cancelled its future is taken without raising; peers named printably."""

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


def test_a_peer_is_named_by_its_node_name_and_a_raw_identity_escaped():
    """Logs and errors name a peer as ``display`` says: a known node by its name; an unknown one by its socket
    identity, escaped where it holds bytes a terminal would not print (a stray client's ZeroMQ identity starts with
    a NUL): before, those bytes went into the servers' log lines as they were."""
    requests = Requests(None, {"ab12": "dc0/worker0"})  # type: ignore[arg-type]
    assert requests.display("ab12") == "dc0/worker0"
    assert requests.display("stranger") == "stranger"
    raw = b"\x00k\x8bEg".decode(errors="replace")
    assert requests.display(raw) == ascii(raw) and requests.display(raw).isprintable()
