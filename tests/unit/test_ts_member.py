"""A worker's TSEngine part (algorithms.tsengine.member) against a recording van: holds, merges, relays, refusals."""

from __future__ import annotations

from concurrent.futures import Future

import numpy as np
import pytest

from geomx.algorithms.tsengine.kinds import RELAY
from geomx.algorithms.tsengine.member import RelayMember
from geomx.protocol.wire import Kind, Message
from geomx.transport.rpc import RemoteError

SERVER, PEER, STRANGER = "dc0/server/s", "dc0/worker/p", "dc0/worker/x"


class RecordingVan:
    def __init__(self) -> None:
        self.sent: list[tuple[str, Message]] = []

    def send(self, peer: str, message: Message) -> None:
        self.sent.append((peer, message))


class RecordingRequests:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Message, Future[Message]]] = []

    def call(self, peer: str, message: Message) -> Future[Message]:
        future: Future[Message] = Future()
        self.calls.append((peer, message, future))
        return future


def from_(sender: str, **fields) -> Message:
    message = Message(RELAY, key=3, slice=0, num_slices=1, **fields)
    message.sender = sender.encode()
    return message


@pytest.fixture
def member():
    van, requests = RecordingVan(), RecordingRequests()
    return RelayMember(van, requests, SERVER, {PEER}, "dc0/worker0"), van, requests  # type: ignore[arg-type]


def test_a_push_is_held_merged_then_sent_where_the_server_says(member):
    relay, van, requests = member
    grad = np.ones(4, np.float32)
    future = relay.push(3, 0, 1, grad, priority=-3)
    grad[:] = 7  # the caller may reuse its buffer: the member holds a copy
    assert van.sent[-1][0] == SERVER and van.sent[-1][1].body == {"ask": True}
    assert relay.handles(from_(PEER, tensor=np.full(4, 2, np.float32), body={"merge": True}))
    assert van.sent[-1][1].body == {"ask": True}  # asks again with the merged sum
    assert relay.handles(from_(SERVER, body={"push": "server"}))
    peer, push, _ = requests.calls[-1]
    assert peer == SERVER and push.kind is Kind.PUSHPULL and push.priority == -3
    np.testing.assert_array_equal(push.tensor, np.full(4, 3, np.float32))
    assert not future.done()  # the value comes by relay, not as the PUSHPULL's answer


def test_a_push_merged_into_a_peer_is_counted_without_data(member):
    relay, van, requests = member
    relay.push(3, 0, 1, np.ones(4, np.float32), priority=0)
    relay.handles(from_(SERVER, body={"push": "peer", "to": PEER}))
    assert van.sent[-1][0] == PEER and van.sent[-1][1].body == {"merge": True}
    _, push, _ = requests.calls[-1]
    assert push.tensor is None and push.body == {"ts_merged": PEER}


def test_the_value_answers_the_pull_is_acked_and_relayed_when_told(member):
    relay, van, _ = member
    future = relay.push(3, 0, 1, np.ones(4, np.float32), priority=0)
    value = np.arange(4, dtype=np.float32)
    assert relay.handles(from_(PEER, tensor=value))
    assert future.result(timeout=1).tensor is value
    assert van.sent[-1][0] == SERVER and van.sent[-1][1].body == {"ack": True}
    relay.handles(from_(SERVER, body={"to": PEER}))
    assert van.sent[-1][0] == PEER and van.sent[-1][1].tensor is value


def test_refusals_and_failed_pushes_fail_the_pull(member):
    relay, _, requests = member
    future = relay.push(3, 0, 1, np.ones(4, np.float32), priority=0)
    refusal = from_(SERVER).error("a TSEngine coordinator takes only RELAY asks and acks")
    refusal.sender = SERVER.encode()
    assert relay.handles(refusal)
    with pytest.raises(RemoteError, match="refused TSEngine: a TSEngine coordinator"):
        future.result(timeout=1)
    future = relay.push(3, 0, 1, np.ones(4, np.float32), priority=0)
    relay.handles(from_(SERVER, body={"push": "server"}))
    requests.calls[-1][2].set_exception(RemoteError("dc0/server refused the request: shape differs"))
    with pytest.raises(RemoteError, match="shape differs"):
        future.result(timeout=1)


def test_a_second_push_before_the_pull_and_strangers_are_refused(member, caplog):
    relay, van, _ = member
    relay.push(3, 0, 1, np.ones(4, np.float32), priority=0)
    with pytest.raises(RuntimeError, match="still being aggregated; pull it first"):
        relay.push(3, 0, 1, np.ones(4, np.float32), priority=0)
    sent = len(van.sent)
    assert relay.handles(from_(STRANGER, tensor=np.ones(4, np.float32), body={"merge": True}))
    assert len(van.sent) == sent and "unexpected RELAY" in caplog.text
    assert not relay.handles(Message(Kind.PULL, key=3))  # not TSEngine's: left to the request table
