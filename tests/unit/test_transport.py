"""The van: two real Van objects over 127.0.0.1 (port 0), delivery, byte counters, emulated WAN rate/latency,
and robustness against garbage on the ROUTER socket."""

from __future__ import annotations

import dataclasses
import math
import queue
import struct
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import zmq

from geomx.config import LinkSpec, PartySpec, Topology
from geomx.protocol import wire
from geomx.protocol.wire import Kind, Message, encode, frames_nbytes
from geomx.transport.van import Van

WAIT = 10.0  # generous upper bound for anything that should happen at once on localhost


def topology(wan: LinkSpec | None = None, lan: LinkSpec | None = None) -> Topology:
    return Topology(parties=(PartySpec("a", 2), PartySpec("b", 1)), central="a", wan=wan or LinkSpec(),
                    lan=lan or LinkSpec())


class Inbox:
    """A handler that records (arrival time, message) into a queue.Queue."""

    def __init__(self) -> None:
        self.queue: queue.Queue[tuple[float, Message]] = queue.Queue()

    def __call__(self, message: Message) -> None:
        self.queue.put((time.monotonic(), message))

    def get(self, timeout: float = WAIT) -> tuple[float, Message]:
        try:
            return self.queue.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no message within {timeout} s") from None

    def get_many(self, n: int, timeout: float = WAIT) -> list[tuple[float, Message]]:
        deadline = time.monotonic() + timeout
        return [self.get(max(0.01, deadline - time.monotonic())) for _ in range(n)]


VanFactory = Callable[..., tuple[Van, Inbox]]


@pytest.fixture
def make_van() -> Iterator[VanFactory]:
    vans: list[Van] = []

    def make(identity: str, party: str, topo: Topology, handler: Callable[[Message], None] | None = None):
        inbox = Inbox()
        van = Van(identity, party=party, topology=topo, handler=handler or inbox)
        vans.append(van)
        van.start()
        return van, inbox

    yield make
    for van in reversed(vans):
        van.stop(flush_timeout=1.0)


def connect(a: Van, b: Van) -> None:
    a.add_peer(b.identity, b.address, party=b.party)
    b.add_peer(a.identity, a.address, party=a.party)


# ---------------------------------------------------------------------------------------------------------
# Delivery


def test_start_binds_a_free_local_port(make_van):
    van, _ = make_van("x", "a", topology())
    assert van.address.startswith("tcp://127.0.0.1:")
    assert int(van.address.rsplit(":", 1)[1]) > 0


def test_message_delivery_both_ways(make_van):
    topo = topology()
    a, inbox_a = make_van("a/one", "a", topo)
    b, inbox_b = make_van("b/two", "b", topo)
    connect(a, b)
    tensor = np.arange(10, dtype=np.float32).reshape(2, 5)
    a.send(b.identity, Message(Kind.PUSHPULL, key=7, slice=1, num_slices=2, request_id=99, tensor=tensor,
                               body={"hello": "b"}))
    _, got = inbox_b.get()
    assert got.kind is Kind.PUSHPULL and (got.key, got.slice, got.num_slices, got.request_id) == (7, 1, 2, 99)
    assert got.body == {"hello": "b"}
    np.testing.assert_array_equal(got.tensor, tensor)
    assert got.sender == b"a/one"
    # the receiver answers the sender through its own DEALER socket
    b.send(got.sender.decode(), got.reply(body={"ok": True}))
    _, reply = inbox_a.get()
    assert reply.is_reply and reply.request_id == 99 and reply.body == {"ok": True}
    assert reply.sender == b"b/two"
    assert a.peer_party(b.identity) == "b" and b.knows(a.identity)


def test_messages_arrive_in_order(make_van):
    topo = topology()
    a, _ = make_van("a/one", "a", topo)
    b, inbox_b = make_van("a/two", "a", topo)
    connect(a, b)
    for i in range(200):
        a.send(b.identity, Message(Kind.BARRIER, round=i))
    assert [m.round for _, m in inbox_b.get_many(200)] == list(range(200))


def test_send_to_unknown_peer_raises(make_van):
    van, _ = make_van("x", "a", topology())
    with pytest.raises(KeyError, match="no connection to peer 'nobody'"):
        van.send("nobody", Message(Kind.PULL))


def test_a_second_peer_at_one_address_is_named_in_a_warning(make_van, caplog):
    """Two peers at one address: the node there would keep one of this van's two connections (one identity) and
    drop the other's messages without a word, so the van says so; not once the first is disconnected for good."""
    van, _ = make_van("x", "a", topology())
    other, _ = make_van("y", "a", topology())
    with caplog.at_level("WARNING", logger="geomx.transport.van"):
        van.add_peer("y", other.address, party="a")
        assert not caplog.records
        van.add_peer("y-again", other.address, party="a")
        assert [r.getMessage() for r in caplog.records] == [
            f"[x] y and y-again are both at {other.address}: the node there keeps one of this node's two "
            "connections, and messages on the other are lost"]
        van.disconnect("y")
        van.disconnect("y-again")
        caplog.clear()
        van.add_peer("y-restarted", other.address, party="a")
        assert not caplog.records


def test_handler_exception_answers_with_error(make_van):
    topo = topology()

    def explode(message: Message) -> None:
        raise RuntimeError("kaboom")

    a, inbox_a = make_van("a/one", "a", topo)
    b, _ = make_van("a/two", "a", topo, handler=explode)
    connect(a, b)
    a.send(b.identity, Message(Kind.PULL, key=3, request_id=5))
    _, error = inbox_a.get()
    assert error.kind is Kind.ERROR and error.is_reply and error.request_id == 5
    assert "kaboom" in error.body["error"]
    # and the node keeps serving
    a.send(b.identity, Message(Kind.PULL, key=4, request_id=6))
    assert inbox_a.get()[1].request_id == 6


# ---------------------------------------------------------------------------------------------------------
# Byte counters


def test_byte_counters_match_and_are_classified(make_van):
    topo = topology()
    a1, inbox_a1 = make_van("a/one", "a", topo)
    a2, inbox_a2 = make_van("a/two", "a", topo)
    b, inbox_b = make_van("b/one", "b", topo)
    connect(a1, a2)
    connect(a1, b)

    wan_messages = [Message(Kind.PUSHPULL, key=i, tensor=np.ones(100 * (i + 1), np.float32)) for i in range(5)]
    lan_messages = [Message(Kind.INIT, key=i, body={"i": i}, tensor=np.ones(7, np.int64)) for i in range(3)]
    back = [Message(Kind.STATS, body={"x": "y" * 50})]
    wan_bytes = sum(frames_nbytes(encode(m)) for m in wan_messages)
    lan_bytes = sum(frames_nbytes(encode(m)) for m in lan_messages)
    back_bytes = sum(frames_nbytes(encode(m)) for m in back)

    for m in wan_messages:
        a1.send(b.identity, m)
    for m in lan_messages:
        a1.send(a2.identity, m)
    for m in back:
        b.send(a1.identity, m)
    inbox_b.get_many(len(wan_messages))
    inbox_a2.get_many(len(lan_messages))
    inbox_a1.get_many(len(back))
    for van in (a1, a2, b):
        assert van.flush(WAIT)  # the "sent" counters are updated once handed to ZeroMQ

    s_a1, s_a2, s_b = (v.counters.snapshot() for v in (a1, a2, b))
    assert s_a1["wan"] == {"sent": wan_bytes, "recv": back_bytes}
    assert s_b["wan"] == {"sent": back_bytes, "recv": wan_bytes}
    assert s_a1["lan"] == {"sent": lan_bytes, "recv": 0}
    assert s_a2["lan"] == {"sent": 0, "recv": lan_bytes}
    assert s_a2["wan"] == {"sent": 0, "recv": 0}
    assert s_b["lan"] == {"sent": 0, "recv": 0}
    assert s_a1["peers"][b.identity] == {"class": "wan", "sent": wan_bytes, "recv": back_bytes}
    assert s_a1["peers"][a2.identity] == {"class": "lan", "sent": lan_bytes, "recv": 0}
    assert s_b["peers"][a1.identity] == {"class": "wan", "sent": back_bytes, "recv": wan_bytes}


# ---------------------------------------------------------------------------------------------------------
# Emulation


@pytest.mark.parametrize("rate_bps,message_bytes,cpu_bound", [(10e6, 1 << 15, False), (100e6, 1 << 18, False),
                                                              (1e9, 1 << 21, True)], ids=["10Mbit", "100Mbit", "1Gbit"])
def test_emulated_wan_rate_accuracy(make_van, rate_bps, message_bytes, cpu_bound):
    """The emulator never lets more through than the link's rate, and reaches it where the CPU is not the limit.

    At 1 Gbit/s the sender's and receiver's Python threads set the pace on a loaded machine (the achieved rate
    fell below 0.9 of the setting under load): there only the cap is checked, whatever the load, and
    ``geomx bench --only emulation`` reports the achieved rate against the setting for every rate.
    """
    target_s = 1.2
    topo = topology(wan=LinkSpec(bandwidth_bps=rate_bps))
    a, _ = make_van("a/sender", "a", topo)
    b, inbox_b = make_van("b/receiver", "b", topo)
    connect(a, b)
    payload = np.zeros(message_bytes, np.uint8)  # referenced, never mutated: one buffer for every send
    message_nbytes = frames_nbytes(encode(Message(Kind.PUSHPULL, tensor=payload)))
    count = math.ceil(target_s * rate_bps / 8 / message_nbytes)
    total = count * message_nbytes
    assert total * 8 / rate_bps >= 1.0  # at least one second of traffic

    first_send = time.monotonic()
    for i in range(count):
        a.send(b.identity, Message(Kind.PUSHPULL, key=i, tensor=payload))
    arrivals = inbox_b.get_many(count, timeout=target_s * 3 + 5)
    last_arrival = max(t for t, _ in arrivals)
    assert sorted(m.key for _, m in arrivals) == list(range(count))

    measured_bps = total * 8 / (last_arrival - first_send)
    assert measured_bps <= rate_bps * 1.10, \
        f"measured {measured_bps / 1e6:.1f} Mbit/s on a {rate_bps / 1e6:.0f} Mbit/s link: too fast"
    if not cpu_bound:
        assert measured_bps >= rate_bps * 0.90, \
            f"measured {measured_bps / 1e6:.1f} Mbit/s on a {rate_bps / 1e6:.0f} Mbit/s link"
    assert a.flush(WAIT)
    assert a.counters.snapshot()["wan"]["sent"] == total
    assert b.counters.snapshot()["wan"]["recv"] == total


def test_wan_share_divides_the_senders_rate(make_van):
    """add_peer(share=4): this process gets a quarter of the party's WAN pipe."""
    rate_bps, share = 40e6, 4
    topo = topology(wan=LinkSpec(bandwidth_bps=rate_bps))
    a, _ = make_van("a/sender", "a", topo)
    b, inbox_b = make_van("b/receiver", "b", topo)
    a.add_peer(b.identity, b.address, party="b", share=share)
    b.add_peer(a.identity, a.address, party="a")
    payload = np.zeros(1 << 16, np.uint8)
    message_nbytes = frames_nbytes(encode(Message(Kind.PUSHPULL, tensor=payload)))
    count = math.ceil(0.6 * rate_bps / share / 8 / message_nbytes)  # ~0.6 s at the shared rate
    start = time.monotonic()
    for i in range(count):
        a.send(b.identity, Message(Kind.PUSHPULL, key=i, tensor=payload))
    last = max(t for t, _ in inbox_b.get_many(count))
    measured_bps = count * message_nbytes * 8 / (last - start)
    assert measured_bps == pytest.approx(rate_bps / share, rel=0.15)


def test_a_party_override_sets_its_wan_link(make_van):
    """Party "b" has its own 20 Mbit/s, 60 ms WAN link; the topology's default WAN is unlimited."""
    slow = LinkSpec(bandwidth_bps=20e6, latency_s=0.06)
    topo = Topology(parties=(PartySpec("a", 1), PartySpec("b", 1, wan=slow)), central="a")
    a, _ = make_van("a/sender", "a", topo)
    b, inbox_b = make_van("b/receiver", "b", topo)
    connect(a, b)
    payload = np.zeros(1 << 16, np.uint8)
    message_nbytes = frames_nbytes(encode(Message(Kind.PUSHPULL, tensor=payload)))
    count = math.ceil(0.5 * slow.bandwidth_bps / 8 / message_nbytes)
    start = time.monotonic()
    for i in range(count):
        a.send(b.identity, Message(Kind.PUSHPULL, key=i, tensor=payload))
    arrivals = sorted(t for t, _ in inbox_b.get_many(count))
    assert arrivals[0] - start >= slow.latency_s
    measured_bps = count * message_nbytes * 8 / (arrivals[-1] - start - slow.latency_s)
    # the cap is exact whatever the load (the default link is unlimited: without the override this is far above);
    # the floor is loose: on a loaded 2-core machine the emulator's threads fell to 0.85 of the rate
    assert measured_bps <= slow.bandwidth_bps * 1.10
    assert measured_bps >= slow.bandwidth_bps * 0.6


def test_lan_is_not_limited_by_the_wan_setting(make_van):
    topo = topology(wan=LinkSpec(bandwidth_bps=1e6, latency_s=0.5))  # absurdly slow WAN
    a1, _ = make_van("a/one", "a", topo)
    a2, inbox = make_van("a/two", "a", topo)
    connect(a1, a2)
    start = time.monotonic()
    a1.send(a2.identity, Message(Kind.PUSHPULL, tensor=np.zeros(1 << 20, np.uint8)))  # 8 s on that WAN
    arrival, _ = inbox.get()
    assert arrival - start < 0.5


def test_wan_latency(make_van):
    latency = 0.05
    topo = topology(wan=LinkSpec(latency_s=latency))
    a, inbox_a = make_van("a/one", "a", topo)
    b, inbox_b = make_van("b/one", "b", topo)
    connect(a, b)
    for _ in range(3):
        start = time.monotonic()
        a.send(b.identity, Message(Kind.PULL, key=1))
        arrival, _ = inbox_b.get()
        assert latency <= arrival - start < latency + 1.0
    # the other direction has its own delayed pipe
    start = time.monotonic()
    b.send(a.identity, Message(Kind.PULL, key=2))
    arrival, _ = inbox_a.get()
    assert latency <= arrival - start < latency + 1.0


def test_priority_reorders_queued_wan_messages(make_van):
    topo = topology(wan=LinkSpec(bandwidth_bps=8e6))  # 1 MB/s
    a, _ = make_van("a/one", "a", topo)
    b, inbox_b = make_van("b/one", "b", topo)
    connect(a, b)
    # 0.1 s on the wire: the rest queues behind it. It has the highest priority because sends issued together
    # may reach the link in the same I/O-thread pass, and then they are all ordered by priority.
    blocker = np.zeros(100_000, np.uint8)
    a.send(b.identity, Message(Kind.PUSHPULL, key=0, priority=100, tensor=blocker))
    for key, priority in [(1, -1), (2, 5), (3, 0), (4, 5)]:
        a.send(b.identity, Message(Kind.PUSHPULL, key=key, priority=priority, tensor=np.zeros(10, np.uint8)))
    assert [m.key for _, m in inbox_b.get_many(5)] == [0, 2, 4, 3, 1]


# ---------------------------------------------------------------------------------------------------------
# Garbage on the ROUTER socket


@pytest.fixture
def intruder() -> Iterator[Callable[[str], zmq.Socket]]:
    context = zmq.Context()
    sockets: list[zmq.Socket] = []

    def connect_to(address: str) -> zmq.Socket:
        sock = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, b"intruder")
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(address)
        sockets.append(sock)
        return sock

    yield connect_to
    for sock in sockets:
        sock.close(linger=0)
    context.term()


GARBAGE: list[list[bytes]] = [
    [b"garbage"],
    [b"", b""],
    [b"\x00" * 3, b"{}", b"xx"],
    [b"GX" + b"\xff" * 60, b""],
    [b"GX\x01" + b"\x00" * 41, b""],  # kind 0
    [encode(Message(Kind.PUSHPULL, tensor=np.ones(4, np.float32)))[0], b"", b"short"],  # wrong data length
    [encode(Message(Kind.PUSHPULL))[0], b"not json"],
    [encode(Message(Kind.PUSHPULL))[0], b"[1]"],
    [bytes(encode(Message(Kind.PUSHPULL, tensor=np.ones(4, np.float32)))[0]), b""],  # missing data frame
    [b"\xde\xad\xbe\xef" * 1000] * 5,
]


def test_garbage_frames_never_crash_the_van(make_van, intruder):
    van, inbox = make_van("a/victim", "a", topology())
    sock = intruder(van.address)
    for frames in GARBAGE:
        sock.send_multipart([bytes(f) for f in frames])
    valid = Message(Kind.PULL, key=42, body={"still": "alive"})
    sock.send_multipart([bytes(f) for f in encode(valid)])
    _, got = inbox.get()  # ZeroMQ keeps order per connection: every piece of garbage was handled before this
    assert got.key == 42 and got.body == {"still": "alive"} and got.sender == b"intruder"
    assert van.malformed == len(GARBAGE)
    assert inbox.queue.empty()
    # a proper peer is still served, and the garbage was counted as received bytes from an unknown sender
    other, _ = make_van("a/peer", "a", topology())
    connect(other, van)
    other.send(van.identity, Message(Kind.BARRIER, round=3))
    assert inbox.get()[1].round == 3
    assert van.counters.snapshot()["peers"]["<unknown>"]["recv"] > 0


def zero_size_header_with_huge_dimension() -> bytes:
    """A dense float32 header of shape (0, 2**62): zero bytes of data, but numpy cannot make the array."""
    return wire._HEADER.pack(b"GX", wire.PROTOCOL_VERSION, int(Kind.PUSHPULL), 0, 0, 1, 2, 0, 0, 0, 1, 0, 0) + \
        struct.pack("<2Q", 0, 2**62)


@pytest.mark.parametrize("frames", [
    [encode(Message(Kind.PUSHPULL))[0], b"[" * 100_000],
    [encode(Message(Kind.PUSHPULL))[0], b'{"n": ' + b"9" * 5000 + b"}"],
    [zero_size_header_with_huge_dimension(), b"", b""],
], ids=["deep-json", "huge-int", "huge-dim"])
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_nasty_garbage_never_crashes_the_van(intruder, frames):
    inbox = Inbox()
    van = Van("a/victim", party="a", topology=topology(), handler=inbox)
    van.start()
    try:
        sock = intruder(van.address)
        sock.send_multipart([bytes(f) for f in frames])
        sock.send_multipart([bytes(f) for f in encode(Message(Kind.PULL, key=42))])
        _, got = inbox.get(timeout=1.0)  # a healthy van delivers this in milliseconds
        assert got.key == 42
        assert van.malformed == 1
    finally:
        van.stop(flush_timeout=0.2)


def test_an_outage_holds_every_message_across_the_cut_wan_then_delivers_them_in_order(make_van):
    """A party cut off for 0.6 s: messages (heartbeats too: priority does not help) wait for the end; the LAN
    and other parties are not affected. The outage counts from training (the first PUSHPULL through the
    sender's van), so however long the vans took to start on a loaded machine it begins with the sends."""
    from geomx.config import Outage

    topo = dataclasses.replace(topology(), parties=(PartySpec("a", 2), PartySpec("b", 1), PartySpec("c", 1)),
                               outages=(Outage("b", 0.0, 0.6, origin="training"),), job_start=time.time())
    a, _ = make_van("a/one", "a", topo)
    a2, inbox_a2 = make_van("a/two", "a", topo)
    b, inbox_b = make_van("b/one", "b", topo)
    c, inbox_c = make_van("c/one", "c", topo)
    for peer in (a2, b, c):
        connect(a, peer)
    start = time.monotonic()
    a.send(b.identity, Message(Kind.PUSHPULL, key=0, priority=2**31 - 1))  # training starts: the cut begins
    for key in (1, 2):
        a.send(b.identity, Message(Kind.PULL, key=key, priority=2**31 - 1))
    a.send(a2.identity, Message(Kind.PULL, key=7))
    a.send(c.identity, Message(Kind.PULL, key=8))
    others = [inbox_a2.get()[0], inbox_c.get()[0]]
    arrivals = inbox_b.get_many(3)
    assert [m.key for _, m in arrivals] == [0, 1, 2]
    assert all(0.6 <= t - start < 2.0 for t, _ in arrivals), [t - start for t, _ in arrivals]
    assert max(others) < min(t for t, _ in arrivals), (others, arrivals)  # the LAN and dc c went on


def access_topology(access_party: str, access_bps: float, wan: LinkSpec | None = None) -> Topology:
    parties = tuple(PartySpec(name, 1, access_bps=access_bps if name == access_party else None)
                    for name in ("a", "b", "c"))
    return dataclasses.replace(topology(wan=wan), parties=parties)


MB = 1 << 20
ACCESS_BPS = 80e6  # 1 MiB takes 0.105 s


def one_mib(key: int) -> Message:
    return Message(Kind.PUSHPULL, key=key, tensor=np.zeros(MB, np.uint8))


def simultaneous_arrivals(make_van, topo: Topology, receiver: tuple[str, str],
                          senders: list[tuple[str, str]]) -> list[float]:
    """Seconds after sending until each sender's 1 MiB message, all sent at once, reached ``receiver``; sorted.
    Vans are given as (identity, party)."""
    target, inbox = make_van(*receiver, topo)
    vans = [make_van(identity, party, topo)[0] for identity, party in senders]
    for van in vans:
        connect(target, van)
    start = time.monotonic()
    for key, van in enumerate(vans):
        van.send(target.identity, one_mib(key))
    return sorted(t - start for t, _ in inbox.get_many(len(vans)))


def test_in_cast_queues_at_the_receivers_access_link(make_van):
    """b and c each send 1 MiB to a at once: a's 80 Mbit/s access link carries them one after the other,
    although each pair of parties has its own (unlimited) WAN pipe."""
    arrivals = simultaneous_arrivals(make_van, access_topology("a", ACCESS_BPS), ("a/server", "a"),
                                     [("b/server", "b"), ("c/server", "c")])
    one = MB * 8 / ACCESS_BPS
    assert arrivals[0] >= 0.9 * one and arrivals[1] >= 1.9 * one, arrivals
    assert arrivals[1] < 2 * one + 0.5, arrivals


def test_sends_to_several_parties_share_the_senders_access_link(make_van):
    topo = access_topology("a", ACCESS_BPS)
    a, _ = make_van("a/server", "a", topo)
    b, inbox_b = make_van("b/server", "b", topo)
    c, inbox_c = make_van("c/server", "c", topo)
    connect(a, b)
    connect(a, c)
    start = time.monotonic()
    a.send(b.identity, one_mib(0))
    a.send(c.identity, one_mib(1))
    arrivals = sorted([inbox_b.get()[0] - start, inbox_c.get()[0] - start])
    one = MB * 8 / ACCESS_BPS
    assert arrivals[0] >= 0.9 * one and arrivals[1] >= 1.9 * one, arrivals


def test_an_access_link_as_fast_as_the_wan_adds_no_second_serialization(make_van):
    """Cut-through: 1 MiB over an 80 Mbit/s WAN pipe behind an 80 Mbit/s access link takes ~0.1 s, not 0.2."""
    topo = access_topology("a", ACCESS_BPS, wan=LinkSpec(bandwidth_bps=ACCESS_BPS))
    a, _ = make_van("a/server", "a", topo)
    b, inbox_b = make_van("b/server", "b", topo)
    connect(a, b)
    start = time.monotonic()
    a.send(b.identity, one_mib(0))
    arrival = inbox_b.get()[0] - start
    one = MB * 8 / ACCESS_BPS
    assert 0.9 * one <= arrival < 1.6 * one, arrival


@pytest.mark.parametrize("ingress", [False, True])
def test_lan_ingress_queues_simultaneous_senders(make_van, ingress):
    """Two workers send 1 MiB each to their server at once over 10 Mbit/s LAN links: each has its own outbound
    link, so without ``ingress`` both arrive after ~one transfer; with it the server's inbound side carries
    them one after the other (in-cast). One transfer takes 0.84 s, so that a loaded machine's scheduling
    delays (up to 0.1 s seen at load average 30 on 2 cores) stay small beside it."""
    rate_bps = 10e6
    topo = dataclasses.replace(topology(lan=LinkSpec(bandwidth_bps=rate_bps, ingress=ingress)),
                               parties=(PartySpec("a", 3),))
    arrivals = simultaneous_arrivals(make_van, topo, ("a/server", "a"), [("a/worker0", "a"), ("a/worker1", "a")])
    one = MB * 8 / rate_bps
    assert arrivals[0] >= 0.9 * one, arrivals
    if ingress:
        assert 1.9 * one <= arrivals[1] < 2 * one + 0.5, arrivals
    else:
        assert arrivals[1] < 1.6 * one, arrivals


def test_a_disconnected_peer_gets_nothing_more_and_sending_to_it_is_not_an_error(make_van):
    """A peer dropped for good: what waited for it in a slow link is discarded, later sends are ignored, an
    unknown peer still raises, and other peers are served as before."""
    topo = topology(lan=LinkSpec(bandwidth_bps=ACCESS_BPS))
    a, _ = make_van("a/server", "a", topo)
    gone, inbox_gone = make_van("a/worker0", "a", topo)
    other, inbox_other = make_van("a/worker1", "a", topo)
    connect(a, gone)
    connect(a, other)
    a.send(gone.identity, Message(Kind.PULL, key=0))
    assert inbox_gone.get()[1].key == 0
    a.send(gone.identity, one_mib(1))  # ~0.1 s on the link: still queued when the peer is disconnected
    a.disconnect(gone.identity)
    a.send(gone.identity, Message(Kind.PULL, key=2))
    a.send(other.identity, Message(Kind.PULL, key=3))
    assert inbox_other.get()[1].key == 3
    assert a.flush(5.0)
    with pytest.raises(queue.Empty):
        inbox_gone.queue.get(timeout=0.5)
    with pytest.raises(KeyError, match="no connection"):
        a.send("a/never-known", Message(Kind.PULL))


# ---------------------------------------------------------------------------------------------------------
# DGT datagrams share the links


class UdpSink:
    """A bound UDP socket that records (arrival time, size) of every datagram."""

    def __init__(self) -> None:
        import socket

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.sock.bind(("127.0.0.1", 0))
        self.address: tuple[str, int] = self.sock.getsockname()

    def receive(self, count: int, timeout: float = WAIT) -> list[tuple[float, int]]:
        got = []
        deadline = time.monotonic() + timeout
        while len(got) < count:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = self.sock.recv(70_000)
            except TimeoutError:
                raise AssertionError(f"{len(got)} of {count} datagrams within {timeout} s") from None
            got.append((time.monotonic(), len(data)))
        return got


@pytest.mark.parametrize("where", ["wan", "access"])
def test_datagrams_share_the_link_behind_messages_and_count_as_its_bytes(make_van, where):
    """Messages and DGT datagrams sent at once to another party: together they take the link's rate (the WAN
    pipe, or the sender's access link in front of an unlimited WAN), every message before any datagram."""
    rate = 16e6  # 2 MB/s
    topo = topology(wan=LinkSpec(bandwidth_bps=rate)) if where == "wan" else access_topology("b", rate)
    a, inbox_a = make_van("a/gs", "a", topo)
    b, _ = make_van("b/ls", "b", topo)
    connect(a, b)
    sink = UdpSink()
    messages = [Message(Kind.PUSHPULL, key=i, tensor=np.zeros(100_000, np.uint8)) for i in range(4)]
    message_bytes = sum(frames_nbytes(encode(m)) for m in messages)
    datagrams = [bytes([i % 256]) * 4000 for i in range(100)]
    start = time.monotonic()
    for m in messages:
        b.send(a.identity, m)
    for i, data in enumerate(datagrams):
        b.send_datagram(a.identity, sink.address, data, channel=1 + i % 3)
    udp = sink.receive(len(datagrams))
    arrivals = inbox_a.get_many(len(messages))
    total = message_bytes + 4000 * len(datagrams)
    last = max(t for t, _ in udp + [(t, 0) for t, _ in arrivals])
    # ~0.4 s of traffic at 2 MB/s: a separate full-rate UDP pipe would end it at ~0.2 s
    assert total * 8 / (last - start) <= rate * 1.05, f"{total * 8 / (last - start) / 1e6:.1f} Mbit/s"
    # behind the messages: a datagram next to them would arrive ~0.2 s (the messages' 400 kB) before the last one;
    # 0.05 s covers the receiving van's dispatch thread being scheduled late on a loaded machine
    assert max(t for t, _ in arrivals) <= min(t for t, _ in udp) + 0.05
    assert b.flush(WAIT)
    assert b.counters.snapshot()["wan"]["sent"] == total
    assert b.counters.snapshot()["peers"][a.identity]["sent"] == total
    assert (b.datagrams.sent, b.datagrams.sent_bytes) == (100, 400_000)


def test_datagrams_emulated_as_lost_take_the_link_but_never_arrive(make_van):
    topo = topology(wan=LinkSpec(bandwidth_bps=80e6))
    a, _ = make_van("a/gs", "a", topo)
    b, _ = make_van("b/ls", "b", topo)
    connect(a, b)
    sink = UdpSink()
    for i in range(10):
        b.send_datagram(a.identity, sink.address, bytes(1000), channel=1, lost=i % 2 == 1)
    assert len(sink.receive(5)) == 5
    assert b.flush(WAIT)
    assert (b.datagrams.sent, b.datagrams.lost, b.counters.snapshot()["wan"]["sent"]) == (10, 5, 10_000)
    sink.sock.settimeout(0.2)
    with pytest.raises(TimeoutError):
        sink.sock.recv(70_000)  # the lost ones never came


def test_received_datagrams_count_with_their_peers_messages(make_van):
    topo = topology()
    a, _ = make_van("a/gs", "a", topo)
    b, _ = make_van("b/ls", "b", topo)
    a2, _ = make_van("a/ls", "a", topo)
    connect(a, b)
    connect(a, a2)
    handled: list[str] = []
    a.receive_datagram(b.identity, 300, lambda: handled.append("b"))
    a.receive_datagram(a2.identity, 200, lambda: handled.append("a2"))
    a.receive_datagram("stranger", 50, lambda: handled.append("stranger"))
    assert handled == ["b", "a2", "stranger"]  # no ingress to pass: handled at once
    snapshot = a.counters.snapshot()
    assert snapshot["wan"]["recv"] == 300 and snapshot["lan"]["recv"] == 250
    assert snapshot["peers"][b.identity]["recv"] == 300 and snapshot["peers"]["<unknown>"]["recv"] == 50


def test_received_datagrams_pass_the_access_link_behind_messages(make_van):
    """In-cast at the global server's party: datagrams received from another party pass its access link too,
    after the messages waiting there, at the link's rate."""
    rate = 16e6  # 2 MB/s
    topo = access_topology("a", rate)
    a, inbox_a = make_van("a/gs", "a", topo)
    b, _ = make_van("b/ls", "b", topo)
    connect(a, b)
    messages = [Message(Kind.PUSHPULL, key=i, tensor=np.zeros(100_000, np.uint8)) for i in range(4)]
    total = sum(frames_nbytes(encode(m)) for m in messages) + 100 * 4000
    delivered: queue.Queue[float] = queue.Queue()
    start = time.monotonic()
    for m in messages:
        b.send(a.identity, m)
    arrivals = inbox_a.get_many(1)  # the first message is on a's access link: the others wait behind it
    for _ in range(100):
        a.receive_datagram(b.identity, 4000, lambda: delivered.put(time.monotonic()))
    arrivals += inbox_a.get_many(len(messages) - 1)
    handled = [delivered.get(timeout=WAIT) for _ in range(100)]
    last = max(handled + [t for t, _ in arrivals])
    assert total * 8 / (last - start) <= rate * 1.05, f"{total * 8 / (last - start) / 1e6:.1f} Mbit/s"
    last_message = max(t for t, _ in arrivals)
    assert sum(t >= last_message for t in handled) >= 99  # behind the messages (one may have been on the wire)
    assert a.counters.snapshot()["wan"]["recv"] == total


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_dispatch_stops_waiting_when_the_io_thread_dies(make_van, caplog):
    """The dispatch thread's wait for messages is bounded: when the I/O thread ends (here: _pump raises),
    it gives up within DISPATCH_POLL_S and says why, and ``running`` turns False (the server's wait for its
    clients' goodbyes checks it)."""
    from geomx.transport import van as transport

    van, _ = make_van("a/x", "a", topology())
    assert van.running
    io, dispatch = van._threads

    def broken_pump() -> float | None:
        raise RuntimeError("injected: the I/O loop fails")

    van._pump = broken_pump  # type: ignore[method-assign]
    van._wake()
    io.join(WAIT)
    assert not io.is_alive()
    dispatch.join(transport.DISPATCH_POLL_S + WAIT)
    assert not dispatch.is_alive(), "the dispatch thread still waits for messages from a dead I/O thread"
    assert not van.running
    assert "stopped waiting for messages to handle: the I/O thread has ended" in caplog.text
