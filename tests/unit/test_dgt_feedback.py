"""DGT's loss feedback without sockets: the receiver's per-channel, per-round accounting (fake clock), the
report's validation, and the sender's adaptive K following the reports (and nothing else)."""

from __future__ import annotations

import numpy as np
import pytest

from geomx.algorithms.dgt.datagrams import DgtAssembler, DgtSender
from geomx.algorithms.dgt.feedback import FEEDBACK_KEY, MAX_ROWS, FeedbackError, LossEstimate, parse_feedback
from geomx.config import DGTSpec
from geomx.protocol.wire import Kind, Message
from geomx.transport.udp import Datagram, decode_datagram


class RecordingPath:
    """A datagram path that only records what it was given (no socket, no van)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, tuple[str, int], bytes, int, bool]] = []

    def send_datagram(self, peer: str, address: tuple[str, int], data: bytes, channel: int,
                      lost: bool = False) -> None:
        self.sent.append((peer, address, data, channel, lost))


def reliable(rnd: int, blocks: list[int], channels: list[int], numel: int = 8) -> Message:
    tensor = np.ones(2 * len(blocks), np.float32)
    return Message(Kind.PUSHPULL, key=0, slice=0, round=rnd, tensor=tensor,
                   body={"dgt": {"blocks": blocks, "udp": sum(channels), "channels": channels, "block_elems": 2,
                                 "numel": numel, "shape": [numel]}})


def block(rnd: int, index: int, channel: int) -> Datagram:
    return Datagram("ls", 0, 0, rnd, index, channel, 2 * index, np.full(2, 3, np.float32))


def test_receiver_counts_received_lost_and_late_per_channel_and_round():
    assembler = DgtAssembler(deadline_s=0.05)
    assert assembler.feedback_for("ls") is None  # nothing happened yet
    # 4 blocks of 2: block 0 reliable; blocks 1, 2 on channel 1 and block 3 on channel 2
    assert assembler.on_reliable("ls", reliable(0, [0], [2, 1]), now=0.0) is None
    assert assembler.on_block(block(0, 1, 1)) is None
    (done,) = assembler.expire(now=1.0)  # deadline: block 2 (channel 1) and block 3 (channel 2) are missing
    np.testing.assert_array_equal(done.tensor, [1, 1, 3, 3, 0, 0, 0, 0])
    assert assembler.on_block(block(0, 3, 2)) is None  # block 3 arrives after its round: late
    report = assembler.feedback_for("ls")
    assert sorted(report["rows"]) == [[0, 0, 0, 1, 1, 1, 0], [0, 0, 0, 2, 0, 1, 1]]
    assert assembler.feedback_for("ls") is None  # reported once
    # round 1 gets all of its blocks: a row per channel, nothing lost
    assert assembler.on_reliable("ls", reliable(1, [0], [2, 1]), now=2.0) is None
    for index, channel in ((1, 1), (2, 1)):
        assert assembler.on_block(block(1, index, channel)) is None
    assert assembler.on_block(block(1, 3, 2)) is not None
    assert sorted(assembler.feedback_for("ls")["rows"]) == [[0, 0, 1, 1, 2, 0, 0], [0, 0, 1, 2, 1, 0, 0]]
    assert assembler.report()["feedback"]["by_sender"]["ls"] == {
        "1": {"received": 3, "lost": 1, "late": 0}, "2": {"received": 1, "lost": 1, "late": 1}}
    assert assembler.feedback_for("other") is None  # reports are per sender


def test_a_receiver_that_is_never_asked_keeps_only_the_newest_rows():
    assembler = DgtAssembler(deadline_s=0.01)
    for rnd in range(MAX_ROWS + 10):
        assembler.on_reliable("ls", reliable(rnd, [0, 1, 2], [1]), now=float(rnd))
        assembler.expire(now=rnd + 0.5)
    rows = assembler.feedback_for("ls")["rows"]
    assert len(rows) == MAX_ROWS and min(r[2] for r in rows) == 10  # the oldest 10 rounds were dropped
    parse_feedback({"rows": rows}, channels=1)  # what the receiver sends, the sender accepts


@pytest.mark.parametrize("report, match", [
    ([], "rows"),
    ({"rows": [[0, 0, 0, 1, 1, 0]]}, "7 non-negative"),
    ({"rows": [[0, 0, 0, 1, 1, 0, -1]]}, "7 non-negative"),
    ({"rows": [[0, 0, 0, 1, 1.5, 0, 0]]}, "7 non-negative"),
    ({"rows": [[0, 0, 0, 1, True, 0, 0]]}, "7 non-negative"),
    ({"rows": [[0, 0, 0, 4, 1, 0, 0]]}, "channel 4"),
    ({"rows": [[0, 0, 0, 0, 1, 0, 0]]}, "channel 0"),
    ({"rows": [], "extra": 1}, "rows"),
    ({"rows": [[0, 0, 0, 1, 1, 0, 0]] * (MAX_ROWS + 1)}, "at most"),
])
def test_malformed_feedback_is_refused(report, match):
    with pytest.raises(FeedbackError, match=match):
        parse_feedback(report, channels=3)


def test_loss_estimate_is_an_ewma_of_reported_loss_and_silent_until_enough_blocks():
    estimate = LossEstimate(weight=0.5, min_samples=50)
    rows = parse_feedback({"rows": [[0, 0, 0, 1, 15, 5, 0], [0, 0, 0, 2, 20, 0, 2]]}, channels=2)
    estimate.on_report(rows)
    assert estimate.per_channel == {1: 0.25, 2: 0.0} and estimate.mean_loss() is None  # 40 blocks < 50
    estimate.on_report(parse_feedback({"rows": [[0, 0, 1, 1, 10, 0, 0]]}, channels=2))
    assert estimate.per_channel[1] == pytest.approx(0.125)  # 0.5 * 0.25 + 0.5 * 0
    assert estimate.mean_loss() == pytest.approx(0.0625) and estimate.late == 2
    estimate.on_report([])  # an empty report changes nothing
    assert estimate.mean_loss() == pytest.approx(0.0625) and estimate.reports == 2


def push_k(sender: DgtSender, path: RecordingPath, rnd: int, values: np.ndarray) -> float:
    fields = sender.push("gs", ("127.0.0.1", 9), 0, 0, rnd, values)
    k = sender.stats.k_history[-1]
    assert len(fields["body"]["dgt"]["blocks"]) == max(1, round(k * 64))
    return k


def answer(channel_rows: list[list[int]]) -> dict:
    return {"other": 1, FEEDBACK_KEY: {"rows": channel_rows}}


def test_adaptive_k_stays_configured_until_a_report_then_follows_the_reported_loss():
    spec = DGTSpec(channels=2, k=0.5, k_min=0.1, adaptive=True, block_bytes=64, loss=(0.3, 0.3), seed=2)
    path = RecordingPath()
    sender = DgtSender(spec, "ls", path)
    values = np.random.default_rng(1).normal(size=64 * 16).astype(np.float32)  # 64 blocks, a flat tail
    # the emulated network drops ~30% of the datagrams, but nobody reported that: K stays where it was set
    ks = [push_k(sender, path, rnd, values) for rnd in range(5)]
    assert ks == [0.5] * 5 and any(lost for *_, lost in path.sent)
    sender.on_answer({"other": 1})  # an answer without a report
    sender.on_answer(answer([[0, 0, 0, 1, 1, 0, 0]]))  # a report of 1 block: too little to act on
    assert push_k(sender, path, 5, values) == 0.5
    # the receiver reports 40% loss on both channels: K rises
    sender.on_answer(answer([[0, 0, 1, 1, 18, 12, 0], [0, 0, 1, 2, 18, 12, 0]]))
    high = push_k(sender, path, 6, values)
    assert high > 0.9
    # reports of no loss: K falls, down to k_min (the first whole number of blocks at or above it: 7 of 64)
    for rnd in range(2, 30):
        sender.on_answer(answer([[0, 0, rnd, 1, 16, 0, 0], [0, 0, rnd, 2, 16, 0, 0]]))
    floor = 7 / 64
    assert push_k(sender, path, 7, values) == pytest.approx(floor)
    # a malformed report is ignored: K does not move
    sender.on_answer(answer([[0, 0, 0, 9, 0, 50, 0]]))
    assert sender.stats.bad_feedback == 1 and push_k(sender, path, 8, values) == pytest.approx(floor)
    report = sender.report()
    assert report["feedback_reports"] == 30 and report["reported_loss"] == pytest.approx(
        sender.loss.mean_loss()) and report["udp_sent"] is None  # the recording path counts nothing


def test_without_adaptive_k_reports_change_nothing():
    sender = DgtSender(DGTSpec(channels=1, k=0.5, block_bytes=64), "ls", RecordingPath())
    values = np.ones(64 * 16, np.float32)
    sender.on_answer(answer([[0, 0, 0, 1, 0, 60, 0]]))
    sender.push("gs", ("127.0.0.1", 9), 0, 0, 0, values)
    assert list(sender.stats.k_history) == [0.5]


def test_the_sender_tells_the_receiver_its_per_channel_counts_and_datagrams_carry_their_size():
    path = RecordingPath()
    sender = DgtSender(DGTSpec(channels=3, k=0.25, block_bytes=64), "ls", path)
    fields = sender.push("gs", ("127.0.0.1", 9), 0, 0, 0, np.arange(1000, dtype=np.float32))
    counts = fields["body"]["dgt"]["channels"]
    assert counts == [sum(1 for *_, c, _ in path.sent if c == channel) for channel in (1, 2, 3)] == [16, 16, 15]
    assert sender.stats.udp_bytes == sum(len(data) for _, _, data, _, _ in path.sent)
    assert decode_datagram(path.sent[0][2]).nbytes == len(path.sent[0][2])
