"""Differential Gradient Transmission (DGT): a push's blocks travel by importance over channels of
different reliability, and the receiver rebuilds the push at a deadline.

Only a local server's pushes to its global server use it (as in GeoMX). Per push of one slice:

1. **Split** the slice into blocks of ``block_bytes``; **score** each by its contribution, an EMA over rounds:
   ``c = alpha * c_prev + (1 - alpha) * mean(|block|)``.
2. **Rank** the blocks by contribution (or at random: the baseline that shows contribution order matters).
   The top ``K`` fraction goes in the reliable ZeroMQ request; the rest is cut evenly, in rank order, over
   UDP channels ``1..C`` (channel 1 first). The datagrams take the same emulated links as the reliable
   messages, behind them (``Van.send_datagram``); each channel's seeded emulated loss drops some on the way.
3. The **receiver** (global server) starts from zeros, adds the reliable blocks and every UDP block of that
   round that arrives, and hands the push on once all blocks are in or ``deadline_s`` after the reliable
   part: lost blocks count as zeros. A block that arrives after its round was assembled is folded into the
   next round of the same stream (GeoMX does the same). It counts per channel and round what arrived, was
   lost and came late, and tells the sender in its answers (``geomx.algorithms.dgt.feedback``).

**Adaptive K** (``adaptive``; GeoMX reads ``ADAPTIVE_K_FLAG`` and ignores it): at each push the sender sets
``K`` to the smallest fraction (at least ``k_min``) whose *expected lost contribution* stays within
``LOSS_BUDGET`` (1%) of the total: ``mean_loss * tail_mass(K) <= LOSS_BUDGET``, where ``tail_mass(K)`` is the
share of the contribution ranked below the top ``K`` and ``mean_loss`` is the loss the receiver *reported*
(an EWMA over its reports, once they covered 50 blocks; until then K stays at its configured value). So K
rises when reported losses rise and falls as contributions concentrate (the convergence signal: a converging
model has a few large blocks and a long flat tail), and with no reported loss everything may go over UDP.

Usage (what a server does when DGT is on)::

    sender = DgtSender(spec, name="dc1/server", path=van)                 # van: geomx.transport.van.Van
    fields = sender.push(gs_id, ("127.0.0.1", port), key, slice_index, round, values)  # the reliable request's fields
    sender.on_answer(reply.body)                                          # the receiver's loss report
    assembler = DgtAssembler(deadline_s=spec.deadline_s)
    done = assembler.on_reliable(sender_id, message, time.monotonic())  # a Message with the dense tensor
    body = {FEEDBACK_KEY: assembler.feedback_for(sender_id)}            # goes with the answer to the push
"""

from __future__ import annotations

import logging
import math
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ...config import DGTSpec
from ...protocol.wire import Message
from ...runs import runlog
from ...transport.emulator import LossyChannel
from ...transport.udp import Datagram, encode_datagram
from .feedback import FEEDBACK_KEY, FeedbackError, FeedbackLedger, LossEstimate, parse_feedback

log = logging.getLogger("geomx.algorithms.dgt.datagrams")

LOSS_BUDGET = 0.01
BODY_KEY = "dgt"


def block_ranges(numel: int, block_elems: int) -> list[tuple[int, int]]:
    """[start, stop) element ranges of the blocks of a slice of ``numel`` elements."""
    return [(s, min(s + block_elems, numel)) for s in range(0, max(numel, 1), block_elems)] if numel else []


def block_scores(values: np.ndarray, ranges: Sequence[tuple[int, int]]) -> np.ndarray:
    """Mean magnitude of each block."""
    magnitudes = np.abs(values.astype(np.float32, copy=False))
    sums = np.add.reduceat(magnitudes, [start for start, _ in ranges]) if len(ranges) else np.zeros(0)
    sizes = np.array([stop - start for start, stop in ranges], dtype=np.float64)
    return np.asarray(sums, dtype=np.float64) / np.maximum(sizes, 1)


def assign_channels(order: Sequence[int], k: float, channels: int) -> dict[int, int]:
    """Block -> channel for blocks ranked ``order`` (most important first): top ``k`` on 0, the rest evenly
    over 1..channels in rank order (at least one block is reliable)."""
    reliable = max(1, round(k * len(order)))
    result = {block: 0 for block in order[:reliable]}
    rest = list(order[reliable:])
    for channel, chunk in enumerate(np.array_split(np.array(rest, dtype=np.int64), channels), start=1):
        for block in chunk.tolist():
            result[int(block)] = channel
    return result


def adaptive_k(sorted_scores: Sequence[float], mean_loss: float, k_min: float,
               budget: float = LOSS_BUDGET) -> float:
    """The smallest K >= k_min whose expected lost contribution ``mean_loss * tail_mass(K)`` is <= budget."""
    n = len(sorted_scores)
    total = float(sum(sorted_scores))
    if n == 0 or total <= 0.0 or mean_loss <= 0.0:
        return k_min
    tail = total
    for reliable in range(0, n + 1):
        if reliable:
            tail -= sorted_scores[reliable - 1]
        k = reliable / n
        if k >= k_min and mean_loss * max(tail, 0.0) / total <= budget:
            return k
    return 1.0


class DatagramPath(Protocol):
    """Where a sender's datagrams go: ``geomx.transport.van.Van`` (shaped like its messages, counted with them)."""

    def send_datagram(self, peer: str, address: tuple[str, int], data: bytes, channel: int,
                      lost: bool = False) -> None: ...


@dataclass
class SenderStats:
    pushes: int = 0
    reliable_blocks: int = 0
    udp_blocks: int = 0
    udp_bytes: int = 0  # bytes of every datagram handed to the path (the emulated-lost ones too: they take the link)
    dropped: list[list[int]] = field(default_factory=list)  # [key, slice, round, block] dropped by emulation
    k_history: deque[float] = field(default_factory=lambda: deque(maxlen=2000))  # the latest pushes' K
    bad_feedback: int = 0


class DgtSender:
    """A local server's side: splits, ranks, sends the UDP blocks, returns the reliable request's fields; its
    adaptive K follows the receiver's reports (``on_answer``)."""

    MAX_DROP_LOG = 100_000

    def __init__(self, spec: DGTSpec, name: str, path: DatagramPath) -> None:
        self.spec = spec
        self.name = name
        self.path = path
        self.block_elems = spec.block_bytes // 4
        self._contribution: dict[tuple[int, int], np.ndarray] = {}
        self._random = random.Random(spec.seed)
        # the emulated network's loss (seeded): a dropped datagram still takes the link, then vanishes
        self._channels = {c: LossyChannel(spec.loss_of(c), seed=spec.seed * 1000 + c)
                          for c in range(1, spec.channels + 1)}
        self.loss = LossEstimate()
        self.stats = SenderStats()

    def current_k(self, sorted_scores: Sequence[float]) -> float:
        """K for a push whose contributions are ``sorted_scores`` (largest first): the configured K until the
        receiver reported enough, then ``adaptive_k`` of the reported loss (when ``adaptive``)."""
        loss = self.loss.mean_loss()
        if not self.spec.adaptive or loss is None:
            return self.spec.k
        return adaptive_k(sorted_scores, loss, self.spec.k_min)

    def on_answer(self, body: dict[str, Any] | None) -> None:
        """The answer to a push: fold in the receiver's loss report if it carries one (a malformed one is
        logged and ignored)."""
        report = (body or {}).get(FEEDBACK_KEY)
        if report is None:
            return
        try:
            self.loss.on_report(parse_feedback(report, self.spec.channels))
        except FeedbackError as exc:
            self.stats.bad_feedback += 1
            log.warning("[%s] ignored a DGT loss report: %s", self.name, exc)

    def push(self, peer: str, address: tuple[str, int], key: int, slice_index: int, rnd: int,
             values: np.ndarray) -> dict[str, Any]:
        """Send the unimportant blocks of ``values`` by UDP to ``peer``'s ``address``; the fields of the reliable
        PUSHPULL request."""
        flat = np.ascontiguousarray(values, dtype=np.float32).reshape(-1)
        ranges = block_ranges(flat.size, self.block_elems)
        scores = block_scores(flat, ranges)
        previous = self._contribution.get((key, slice_index))
        if previous is not None and previous.shape == scores.shape:
            scores = self.spec.alpha * previous + (1.0 - self.spec.alpha) * scores
        self._contribution[(key, slice_index)] = scores
        if self.spec.random_order:
            order = list(range(len(ranges)))
            self._random.shuffle(order)
        else:
            order = [int(i) for i in np.argsort(-scores, kind="stable")]
        k = self.current_k(sorted(scores.tolist(), reverse=True)) if ranges else self.spec.k
        channel_of = assign_channels(order, k, self.spec.channels) if ranges else {}
        reliable = sorted(b for b, c in channel_of.items() if c == 0)
        udp = sorted((channel_of[b], rank, b) for rank, b in enumerate(order) if channel_of[b] != 0)
        per_channel = [0] * self.spec.channels
        for channel, _, block in udp:
            start, stop = ranges[block]
            data = encode_datagram(Datagram(self.name, key, slice_index, rnd, block, channel, start, flat[start:stop]))
            lost = self._channels[channel].drop()
            self.path.send_datagram(peer, address, data, channel, lost)
            self.stats.udp_bytes += len(data)
            per_channel[channel - 1] += 1
            if lost and len(self.stats.dropped) < self.MAX_DROP_LOG:
                self.stats.dropped.append([key, slice_index, rnd, block])
        self.stats.pushes += 1
        self.stats.reliable_blocks += len(reliable)
        self.stats.udp_blocks += len(udp)
        self.stats.k_history.append(k)
        values_out = (np.concatenate([flat[ranges[b][0]:ranges[b][1]] for b in reliable]) if reliable
                      else np.zeros(0, np.float32))
        body = {BODY_KEY: {"blocks": reliable, "udp": len(udp), "channels": per_channel,
                           "block_elems": self.block_elems, "numel": flat.size, "shape": list(values.shape)}}
        return {"tensor": values_out, "body": body}

    def report(self) -> dict[str, Any]:
        """For ``RUN/dgt/``; ``udp_sent``/``lost_to_outage`` come from the path's counters when it has them."""
        counts = getattr(self.path, "datagrams", None)
        return {"name": self.name, "role": "sender", "pushes": self.stats.pushes,
                "reliable_blocks": self.stats.reliable_blocks, "udp_blocks": self.stats.udp_blocks,
                "udp_bytes": self.stats.udp_bytes,
                "udp_sent": None if counts is None else counts.sent - counts.lost,
                "lost_to_outage": None if counts is None else counts.lost_to_outage,
                "reported_loss": self.loss.mean_loss(), "channel_loss": dict(self.loss.per_channel),
                "feedback_reports": self.loss.reports, "feedback_blocks": self.loss.samples,
                "late_reported": self.loss.late, "bad_feedback": self.stats.bad_feedback,
                "k_history": list(self.stats.k_history), "dropped": self.stats.dropped}


class DgtError(ValueError):
    """A reliable DGT request that does not describe its blocks correctly."""


@dataclass
class _Pending:
    sender: str
    message: Message
    buffer: np.ndarray
    expected_udp: int
    deadline: float
    nblocks: int
    reliable: frozenset[int]
    per_channel: list[int]  # UDP blocks sent on channel c at [c - 1]
    received: set[int] = field(default_factory=set)
    received_on: dict[int, int] = field(default_factory=dict)  # channel -> blocks received


@dataclass
class _Stream:
    """One sender's pushes of one (key, slice)."""

    assembled: int = -1  # the last round handed on
    pending: dict[int, _Pending] = field(default_factory=dict)  # round -> waiting for UDP blocks
    early: dict[int, list[Datagram]] = field(default_factory=dict)  # round -> blocks before their request
    late: dict[int, tuple[int, np.ndarray]] = field(default_factory=dict)  # block -> (offset, sum) for next round


@dataclass
class AssemblerStats:
    assembled: int = 0
    udp_received: int = 0
    lost: int = 0
    late_folded: int = 0
    stray: int = 0  # datagrams for no known stream or too old to keep
    missing: list[list[Any]] = field(default_factory=list)  # [sender, key, slice, round, [blocks]] at deadline


class DgtAssembler:
    """The global server's side: rebuilds each push from its reliable part and its UDP blocks. Not
    thread-safe: the caller holds its lock."""

    MAX_MISSING_LOG = 20_000
    MAX_EARLY_ROUNDS = 4

    def __init__(self, deadline_s: float) -> None:
        self.deadline_s = deadline_s
        self._streams: dict[tuple[str, int, int], _Stream] = {}
        self.stats = AssemblerStats()
        self.feedback = FeedbackLedger()

    def feedback_for(self, sender: str) -> dict[str, Any] | None:
        """The loss report for ``sender`` to send with an answer to its push (None: nothing new)."""
        return self.feedback.take(sender)

    def on_reliable(self, sender: str, message: Message, now: float) -> Message | None:
        """The reliable part of a push; the assembled dense push if no UDP block is outstanding."""
        spec = (message.body or {}).get(BODY_KEY)
        if not isinstance(spec, dict):
            raise DgtError("the request carries no DGT block description")
        blocks, udp, block_elems = spec.get("blocks"), spec.get("udp"), spec.get("block_elems")
        numel, shape, per_channel = spec.get("numel"), spec.get("shape"), spec.get("channels")
        if (not isinstance(blocks, list) or not all(isinstance(b, int) for b in blocks) or not isinstance(udp, int)
                or not isinstance(block_elems, int) or block_elems < 1 or not isinstance(numel, int) or numel < 0
                or not isinstance(shape, list) or math.prod(shape) != numel):
            raise DgtError(f"malformed DGT description {str(spec)[:200]}")
        if (not isinstance(per_channel, list) or not 1 <= len(per_channel) <= 7
                or not all(isinstance(n, int) and n >= 0 for n in per_channel) or sum(per_channel) != udp):
            raise DgtError(f"DGT 'channels' must list 1..7 per-channel block counts summing to {udp}, "
                           f"got {str(per_channel)[:100]}")
        nblocks = -(-numel // block_elems)
        if len(set(blocks)) != len(blocks) or any(not 0 <= b < nblocks for b in blocks) or udp != nblocks - len(blocks):
            raise DgtError(f"DGT blocks {blocks[:20]} and {udp} UDP blocks do not cover {nblocks} blocks")
        tensor = message.tensor
        sizes = [min(numel, (b + 1) * block_elems) - b * block_elems for b in blocks]
        if tensor is None or tensor.dtype != np.float32 or tensor.size != sum(sizes):
            raise DgtError(f"the reliable part must hold {sum(sizes)} float32 values")
        buffer = np.zeros(numel, np.float32)
        at = 0
        for block, size in zip(blocks, sizes, strict=True):
            buffer[block * block_elems:block * block_elems + size] = tensor[at:at + size]
            at += size
        stream = self._streams.setdefault((sender, message.key, message.slice), _Stream())
        for offset, values in stream.late.values():  # blocks that missed earlier rounds
            buffer[offset:offset + values.size] += values
            self.stats.late_folded += 1
        stream.late.clear()
        message.body = None
        message.shape = tuple(shape)
        pending = _Pending(sender, message, buffer, udp, now + self.deadline_s, nblocks, frozenset(blocks),
                           per_channel)
        stream.pending[message.round] = pending
        for datagram in stream.early.pop(message.round, []):
            self._add(pending, datagram)
        for old in [r for r in stream.early if r < message.round]:
            self.stats.stray += len(stream.early.pop(old))
        return self._finish(stream, message.round) if len(pending.received) >= udp else None

    def on_block(self, datagram: Datagram) -> Message | None:
        """One UDP block; the assembled push if it was the last one outstanding."""
        stream = self._streams.get((datagram.sender, datagram.key, datagram.slice))
        if stream is None:
            stream = self._streams[(datagram.sender, datagram.key, datagram.slice)] = _Stream()
        self.stats.udp_received += 1
        pending = stream.pending.get(datagram.round)
        if pending is not None:
            self._add(pending, datagram)
            return self._finish(stream, datagram.round) if len(pending.received) >= pending.expected_udp else None
        if datagram.round <= stream.assembled:  # late: fold into the next round
            self.feedback.on_late(datagram.sender, datagram.key, datagram.slice, datagram.round, datagram.channel)
            held = stream.late.get(datagram.block)
            values = datagram.values.astype(np.float32) if held is None else held[1] + datagram.values
            stream.late[datagram.block] = (datagram.offset, values)
            return None
        if len(stream.early) >= self.MAX_EARLY_ROUNDS and datagram.round not in stream.early:
            self.stats.stray += 1
            return None
        stream.early.setdefault(datagram.round, []).append(datagram)
        return None

    def expire(self, now: float) -> list[Message]:
        """Assemble every push whose deadline has passed (missing blocks stay zero)."""
        done = []
        for key, stream in self._streams.items():
            for rnd in sorted(r for r, p in stream.pending.items() if p.deadline <= now):
                pending = stream.pending[rnd]
                missing = pending.expected_udp - len(pending.received)
                self.stats.lost += missing
                if len(self.stats.missing) < self.MAX_MISSING_LOG:
                    self.stats.missing.append([key[0], key[1], key[2], rnd, self._missing_blocks(pending)])
                done.append(self._finish(stream, rnd))
        return done

    @staticmethod
    def _missing_blocks(pending: _Pending) -> list[int]:
        return [b for b in range(pending.nblocks) if b not in pending.received and b not in pending.reliable]

    def _add(self, pending: _Pending, datagram: Datagram) -> None:
        stop = datagram.offset + datagram.values.size
        if datagram.block in pending.received or stop > pending.buffer.size:
            self.stats.stray += 1
            return
        pending.buffer[datagram.offset:stop] += datagram.values
        pending.received.add(datagram.block)
        pending.received_on[datagram.channel] = pending.received_on.get(datagram.channel, 0) + 1

    def _finish(self, stream: _Stream, rnd: int) -> Message:
        pending = stream.pending.pop(rnd)
        stream.assembled = max(stream.assembled, rnd)
        self.stats.assembled += 1
        message = pending.message
        self.feedback.on_round(pending.sender, message.key, message.slice, rnd, pending.per_channel,
                               pending.received_on)
        message.tensor = pending.buffer.reshape(message.shape)
        message.dtype = message.tensor.dtype
        return message

    def next_deadline(self) -> float | None:
        deadlines = [p.deadline for s in self._streams.values() for p in s.pending.values()]
        return min(deadlines) if deadlines else None

    def report(self) -> dict[str, Any]:
        s = self.stats
        return {"role": "receiver", "assembled": s.assembled, "udp_received": s.udp_received, "lost": s.lost,
                "late_folded": s.late_folded, "stray": s.stray, "missing": s.missing,
                "feedback": self.feedback.report()}


def write_report(run_dir: Path, name: str, report: dict[str, Any]) -> Path:
    """Write one server's DGT report to ``RUN/dgt/<name>.json`` (read by tests and the bench)."""
    return runlog.write_report(run_dir, "dgt", name, report)


def read_reports(run_dir: Path) -> dict[str, dict[str, Any]]:
    """Every dgt report of a run, by file stem."""
    return runlog.read_reports(run_dir, "dgt")
