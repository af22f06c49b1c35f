"""The van's link model on its own clock (no sockets): sends over a pipe that shapes nothing leave at the next
``due``, highest priority first, and a pipe that shapes anything (a rate, a delay, an outage on the way) still
queues them; and the I/O thread's multipart loops over ``inproc``."""

from __future__ import annotations

import pytest
import zmq

from geomx.config import LinkSpec, Outage, PartySpec, Topology
from geomx.transport.counters import DatagramCounts
from geomx.transport.frames import receive_frames, send_frames
from geomx.transport.links import LinkModel, Outgoing


def model(wan: LinkSpec | None = None, outages: tuple[Outage, ...] = ()) -> LinkModel:
    topology = Topology(parties=(PartySpec("a", 2), PartySpec("b", 1)), central="a", wan=wan or LinkSpec(),
                        lan=LinkSpec(), outages=outages, job_start=0.0 if outages else None)
    links = LinkModel(topology, "a", DatagramCounts(), deliver=lambda item: None)
    for identity, party in (("a/two", "a"), ("b/one", "b")):
        links.add_peer(links.new_peer(identity, f"tcp://127.0.0.1:{len(identity)}", party), share=1)
    return links


def offer(links: LinkModel, peer: str, priorities: list[int], now: float) -> list[Outgoing]:
    sent = [Outgoing(peer, [b"x"], 1000 + index) for index, _ in enumerate(priorities)]
    for outgoing, priority in zip(sent, priorities, strict=True):
        links.offer(outgoing, priority, now)
    return sent


@pytest.mark.parametrize("peer", ["a/two", "b/one"])
def test_an_unshaped_pipe_sends_at_the_next_due_highest_priority_first(peer: str) -> None:
    links = model()
    sent = offer(links, peer, [0, 5, 1, 5], now=1.0)
    assert not links.idle()  # a flush waits for them
    assert links.next_due() is not None and links.next_due() <= 1.0
    links.advance(1.0)
    assert links.due(1.0) == [sent[1], sent[3], sent[2], sent[0]]  # FIFO among equals
    assert links.idle() and links.next_due() is None


def test_a_pipe_with_a_rate_still_paces_what_it_carries() -> None:
    links = model(wan=LinkSpec(bandwidth_bps=8e6))  # 1000 bytes take 1 ms
    sent = offer(links, "b/one", [0, 0], now=1.0)
    links.advance(1.0)
    assert links.due(1.0) == []
    links.advance(1.0015)
    assert links.due(1.0015) == [sent[0]]
    links.advance(1.003)
    assert links.due(1.003) == [sent[1]]


def test_a_wan_that_an_outage_may_cut_still_holds_its_sends() -> None:
    links = model(outages=(Outage("b", 0.0, 0.5, origin="training"),))
    links.outages.training_started(10.0)
    sent = offer(links, "b/one", [0], now=10.0)
    lan = offer(links, "a/two", [0], now=10.0)
    links.advance(10.0)
    assert links.due(10.0) == lan  # the LAN goes on; the cut WAN holds its message
    links.advance(10.6)
    assert links.due(10.6) == sent


def test_multipart_frames_travel_whole() -> None:
    context = zmq.Context()
    sender, receiver = context.socket(zmq.PAIR), context.socket(zmq.PAIR)
    try:
        receiver.bind("inproc://frames")
        sender.connect("inproc://frames")
        with pytest.raises(zmq.Again):
            receive_frames(receiver)
        send_frames(sender, [b"header", b"", memoryview(b"data" * 1000)])
        send_frames(sender, [b"alone"])
        assert [f.bytes for f in _wait(receiver)] == [b"header", b"", b"data" * 1000]
        assert [f.bytes for f in _wait(receiver)] == [b"alone"]
    finally:
        sender.close(linger=0)
        receiver.close(linger=0)
        context.term()


def _wait(sock: zmq.Socket) -> list[zmq.Frame]:
    """The next message, once ``sock`` has one (bounded: 10 s)."""
    assert sock.poll(10_000, zmq.POLLIN), "no message within 10 s"
    return receive_frames(sock)

