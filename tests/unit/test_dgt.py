"""DGT's pieces: channel assignment, adaptive K, the datagram format, seeded loss, the receiver's loss reports
and K following them, and reassembly over real loopback UDP (sender and assembler in one process, the
datagrams leaving through a real Van)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from geomx.algorithms.dgt.datagrams import (
    DgtAssembler,
    DgtError,
    DgtSender,
    adaptive_k,
    assign_channels,
    block_ranges,
    block_scores,
)
from geomx.config import DGTSpec, Outage, PartySpec, Topology
from geomx.protocol.wire import Kind, Message
from geomx.transport.emulator import LossyChannel, OutageSchedule
from geomx.transport.udp import Datagram, DatagramError, UdpReceiver, decode_datagram, encode_datagram
from geomx.transport.van import Van


def test_assign_channels_top_k_reliable_rest_evenly_in_rank_order():
    order = [5, 2, 7, 0, 1, 3, 4, 6, 8, 9]
    channel = assign_channels(order, k=0.3, channels=3)
    assert [b for b in order if channel[b] == 0] == [5, 2, 7]
    assert [channel[b] for b in order[3:]] == [1, 1, 1, 2, 2, 3, 3]
    assert assign_channels([4, 1], k=0.01, channels=2) == {4: 0, 1: 1}  # at least one block is reliable


def test_block_scores_are_mean_magnitudes():
    values = np.array([1, -3, 2, 2, -8], np.float32)
    ranges = block_ranges(5, 2)
    assert ranges == [(0, 2), (2, 4), (4, 5)]
    np.testing.assert_allclose(block_scores(values, ranges), [2.0, 2.0, 8.0])


def test_adaptive_k_rises_with_loss_and_falls_as_contributions_concentrate():
    flat = [1.0] * 100
    assert adaptive_k(flat, mean_loss=0.0, k_min=0.2) == 0.2  # nothing is lost: the minimum
    low, high = adaptive_k(flat, 0.02, 0.2), adaptive_k(flat, 0.2, 0.2)
    assert 0.2 < low < high  # flat tail: 2% loss -> keep half reliable; 20% -> 95%
    assert low == pytest.approx(0.5) and high == pytest.approx(0.95)
    concentrated = [100.0] * 10 + [0.01] * 90  # a converging model: a few big blocks, a flat small tail
    assert adaptive_k(concentrated, 0.2, 0.05) == pytest.approx(0.1)


def test_datagram_round_trip_and_validation():
    d = Datagram("dc1/server/ab", key=3, slice=1, round=9, block=4, channel=2, offset=256,
                 values=np.arange(64, dtype=np.float32))
    back = decode_datagram(encode_datagram(d))
    assert (back.sender, back.key, back.slice, back.round, back.block, back.channel, back.offset) == \
        ("dc1/server/ab", 3, 1, 9, 4, 2, 256)
    np.testing.assert_array_equal(back.values, d.values)
    data = encode_datagram(d)
    for bad, match in ((data[:10], "shorter"), (b"XX" + data[2:], "magic"), (data[:-1], "float32"),
                       (data[:2] + b"\x09" + data[3:], "version")):
        with pytest.raises(DatagramError, match=match):
            decode_datagram(bad)


def test_lossy_channel_is_seeded():
    a, b = LossyChannel(0.3, seed=5), LossyChannel(0.3, seed=5)
    drops = [a.drop() for _ in range(2000)]
    assert drops == [b.drop() for _ in range(2000)]
    assert 0.25 < sum(drops) / 2000 < 0.35
    with pytest.raises(ValueError, match="loss rate"):
        LossyChannel(1.0, seed=0)


def two_parties(spec: DGTSpec, **options: object) -> Topology:
    """The global server's party "a" and the sender's party "b" (no link limits: DGT paces at spec.rate_bps)."""
    return Topology(parties=(PartySpec("a", 1), PartySpec("b", 1)), central="a", dgt=spec, **options)


class Loopback:
    """A DgtSender (its datagrams leaving through a real Van, as in a local server) and a DgtAssembler joined by
    real UDP on 127.0.0.1."""

    def __init__(self, spec: DGTSpec, topology: Topology | None = None) -> None:
        topology = topology or two_parties(spec)
        self.assembler = DgtAssembler(spec.deadline_s)
        self.lock = threading.Lock()
        self.done: list[Message] = []
        self.arrived = threading.Condition(self.lock)
        self.receiver = UdpReceiver("127.0.0.1", 0, self.on_block, self.on_tick)
        self.gs = Van("gs", "a", topology, handler=lambda message: None)
        self.van = Van("ls", "b", topology, handler=lambda message: None)
        self.gs.start()
        self.van.start()
        self.van.add_peer("gs", self.gs.address, party="a")
        self.sender = DgtSender(spec, "ls", self.van)
        self.receiver.start()

    def on_block(self, datagram: Datagram) -> None:
        with self.lock:
            self._finished(self.assembler.on_block(datagram))

    def on_tick(self, now: float) -> None:
        with self.lock:
            for message in self.assembler.expire(now):
                self._finished(message)

    def _finished(self, message: Message | None) -> None:
        if message is not None:
            self.done.append(message)
            self.arrived.notify_all()

    def push(self, rnd: int, values: np.ndarray) -> np.ndarray:
        fields = self.sender.push("gs", ("127.0.0.1", self.receiver.port), 0, 0, rnd, values)
        message = Message(Kind.PUSHPULL, key=0, round=rnd, tensor=fields["tensor"], body=fields["body"])
        with self.lock:
            self._finished(self.assembler.on_reliable("ls", message, time.monotonic()))
            assert self.arrived.wait_for(lambda: any(m.round == rnd for m in self.done), timeout=10)
            return next(m for m in self.done if m.round == rnd).tensor

    def close(self) -> None:
        self.van.stop(flush_timeout=1.0)
        self.gs.stop(flush_timeout=1.0)
        self.receiver.stop()


def test_loopback_without_loss_rebuilds_the_push_exactly():
    link = Loopback(DGTSpec(channels=3, k=0.25, block_bytes=64, deadline_s=2.0))
    try:
        values = np.random.default_rng(0).normal(size=1000).astype(np.float32)
        np.testing.assert_array_equal(link.push(0, values), values)
        assert link.sender.stats.udp_blocks == 47 and link.assembler.stats.lost == 0  # 63 blocks, 16 reliable
    finally:
        link.close()


def test_loopback_with_loss_has_zeros_exactly_where_blocks_were_dropped():
    link = Loopback(DGTSpec(channels=2, k=0.5, block_bytes=64, deadline_s=0.2, loss=(0.2, 0.4), seed=11))
    try:
        values = np.arange(1, 1001, dtype=np.float32)
        got = link.push(0, values)
        dropped = [block for _, _, _, block in link.sender.stats.dropped]
        assert dropped  # 32 UDP blocks at 20-40% loss
        expected = values.copy()
        for block in dropped:
            expected[block * 16:(block + 1) * 16] = 0.0
        np.testing.assert_array_equal(got, expected)
        assert link.assembler.stats.missing == [["ls", 0, 0, 0, sorted(dropped)]]
    finally:
        link.close()


def test_late_blocks_fold_into_the_next_round():
    assembler = DgtAssembler(deadline_s=0.01)
    reliable = Message(Kind.PUSHPULL, key=0, round=0, tensor=np.ones(2, np.float32),
                       body={"dgt": {"blocks": [0], "udp": 1, "channels": [1], "block_elems": 2, "numel": 4,
                                     "shape": [4]}})
    assert assembler.on_reliable("ls", reliable, now=0.0) is None
    (first,) = assembler.expire(now=1.0)
    np.testing.assert_array_equal(first.tensor, [1, 1, 0, 0])  # block 1 lost at the deadline
    assert assembler.on_block(Datagram("ls", 0, 0, 0, 1, 1, 2, np.full(2, 5, np.float32))) is None  # late
    second = Message(Kind.PUSHPULL, key=0, round=1, tensor=np.ones(2, np.float32),
                     body={"dgt": {"blocks": [0], "udp": 1, "channels": [1], "block_elems": 2, "numel": 4,
                                   "shape": [4]}})
    assert assembler.on_reliable("ls", second, now=2.0) is None
    done = assembler.on_block(Datagram("ls", 0, 0, 1, 1, 1, 2, np.full(2, 2, np.float32)))
    assert done is not None
    np.testing.assert_array_equal(done.tensor, [1, 1, 7, 7])  # round 1's block plus round 0's late one
    assert assembler.stats.late_folded == 1


@pytest.mark.parametrize("dgt", [
    {"blocks": [0, 0], "udp": 0, "channels": [0], "block_elems": 2, "numel": 4, "shape": [4]},
    {"blocks": [0], "udp": 5, "channels": [5], "block_elems": 2, "numel": 4, "shape": [4]},
    {"blocks": [9], "udp": 1, "channels": [1], "block_elems": 2, "numel": 4, "shape": [4]},
    {"blocks": [0], "udp": 1, "channels": [1], "block_elems": 2, "numel": 4, "shape": [5]},
    {"blocks": [0], "udp": 1, "channels": [0, 2], "block_elems": 2, "numel": 4, "shape": [4]},  # sums to 2
    {"blocks": [0], "udp": 1, "block_elems": 2, "numel": 4, "shape": [4]},  # no per-channel counts
    {"blocks": "x"},
])
def test_malformed_reliable_parts_are_refused(dgt):
    message = Message(Kind.PUSHPULL, tensor=np.ones(2, np.float32), body={"dgt": dgt})
    with pytest.raises(DgtError):
        DgtAssembler(0.1).on_reliable("ls", message, now=0.0)


def test_datagrams_sent_during_an_outage_are_lost():
    """A cut WAN (an emulated outage of the sender's party) loses UDP datagrams (ZeroMQ messages wait for the
    link instead); once the outage is over they arrive again."""
    spec = DGTSpec(channels=1, k=0.5, block_bytes=64, deadline_s=0.3)
    topology = two_parties(spec, outages=(Outage("b", 0.0, 2.0),), job_start=time.time())
    schedule = OutageSchedule(topology.outages, "b", topology.job_start)
    link = Loopback(spec, topology)
    try:
        values = np.arange(1, 65, dtype=np.float32)  # 4 blocks: 2 reliable, 2 by UDP
        assert schedule.blocked_until("a", time.monotonic()) is not None  # precondition: still in the outage
        got = link.push(0, values)
        assert link.van.datagrams.lost_to_outage == 2 and link.sender.report()["lost_to_outage"] == 2
        assert link.assembler.stats.lost == 2 and np.count_nonzero(got) == 32  # the UDP blocks count as zeros
        deadline = time.monotonic() + 10
        while schedule.blocked_until("a", time.monotonic()) is not None and time.monotonic() < deadline:
            time.sleep(0.02)  # waiting for the emulated outage to end (a condition, bounded)
        np.testing.assert_array_equal(link.push(1, values), values)  # the WAN is back
    finally:
        link.close()
