"""DGT's loss feedback: the receiver counts what each sender's UDP channels delivered; the sender's adaptive K
follows those counts, not its own guess.

**Receiver** (``FeedbackLedger``, kept by ``datagrams.DgtAssembler``): per sender and per (key, slice, round,
UDP channel), the blocks that arrived in time (``received``), were missing when the round was assembled at
its deadline (``lost``), and arrived after that (``late``: folded into the next round, counted in ``lost``
too). The rows a sender has not been told yet ride on the next answer to one of its pushes, in the body under
``FEEDBACK_KEY``: ``{"rows": [[key, slice, round, channel, received, lost, late], ...]}`` (integers only, at
most ``MAX_ROWS``, the newest; a late block's row may come in a later answer than its round's).

**Sender** (``LossEstimate``, kept by ``geomx.algorithms.dgt.datagrams.DgtSender``): per channel an EWMA over reports of
``lost / (received + lost)``; ``mean_loss()`` is the mean over the channels heard of, and None until the
reports together covered ``min_samples`` blocks: until then K stays at its configured value.

Usage::

    ledger = FeedbackLedger()
    ledger.on_round("dc1/server", key=0, slice_index=0, rnd=3, expected=[10, 10], received={1: 10, 2: 7})
    body = {FEEDBACK_KEY: ledger.take("dc1/server")}               # goes with the answer to the push
    estimate = LossEstimate(); estimate.on_report(parse_feedback(body[FEEDBACK_KEY], channels=2))
    estimate.mean_loss()                                           # None until 50 blocks were reported
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

FEEDBACK_KEY = "dgt_feedback"
MAX_ROWS = 256
_FIELDS = ("key", "slice", "round", "channel", "received", "lost", "late")


class FeedbackError(ValueError):
    """A feedback report that does not have the documented shape."""


@dataclass(frozen=True)
class FeedbackRow:
    """What one UDP channel delivered of one round of one slice (increments since the last report)."""

    key: int
    slice: int
    round: int
    channel: int
    received: int
    lost: int
    late: int


def parse_feedback(report: Any, channels: int) -> list[FeedbackRow]:
    """Validate a report (``{"rows": [[7 ints], ...]}``) from the receiver; raises FeedbackError naming the fault."""
    if not isinstance(report, dict) or set(report) != {"rows"} or not isinstance(report["rows"], list):
        raise FeedbackError(f"a DGT feedback report is {{'rows': [...]}}, got {str(report)[:200]}")
    rows = report["rows"]
    if len(rows) > MAX_ROWS:
        raise FeedbackError(f"a DGT feedback report has at most {MAX_ROWS} rows, got {len(rows)}")
    parsed = []
    for row in rows:
        if (not isinstance(row, list) or len(row) != len(_FIELDS)
                or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in row)):
            raise FeedbackError(f"a DGT feedback row is {len(_FIELDS)} non-negative integers {_FIELDS}, got "
                                f"{str(row)[:100]}")
        entry = FeedbackRow(*row)
        if not 1 <= entry.channel <= channels:
            raise FeedbackError(f"DGT feedback for channel {entry.channel}, but this sender has channels 1..{channels}")
        parsed.append(entry)
    return parsed


@dataclass
class FeedbackLedger:
    """The receiver's counts per sender; ``take`` hands the unreported ones over. Not thread-safe (the assembler's
    caller holds its lock)."""

    max_rows: int = MAX_ROWS
    _rows: dict[str, dict[tuple[int, int, int, int], list[int]]] = field(default_factory=dict)
    totals: dict[str, dict[int, list[int]]] = field(default_factory=dict)  # sender -> channel -> [recv, lost, late]
    dropped_rows: int = 0  # rows overwritten before any answer carried them (more than max_rows pending)

    def on_round(self, sender: str, key: int, slice_index: int, rnd: int, expected: Sequence[int],
                 received: Mapping[int, int]) -> None:
        """A round was assembled: ``expected[c - 1]`` blocks were sent on channel c, ``received[c]`` arrived."""
        for channel, count in enumerate(expected, start=1):
            got = min(received.get(channel, 0), count)
            if count:
                self._add(sender, (key, slice_index, rnd, channel), got, count - got, 0)

    def on_late(self, sender: str, key: int, slice_index: int, rnd: int, channel: int) -> None:
        """A block of an assembled round arrived (it was counted lost then)."""
        self._add(sender, (key, slice_index, rnd, channel), 0, 0, 1)

    def take(self, sender: str) -> dict[str, Any] | None:
        """The sender's unreported rows as a report (None if there are none); they count as reported."""
        rows = self._rows.pop(sender, None)
        if not rows:
            return None
        return {"rows": [[*where, *counts] for where, counts in rows.items()]}

    def _add(self, sender: str, where: tuple[int, int, int, int], received: int, lost: int, late: int) -> None:
        rows = self._rows.setdefault(sender, {})
        if where not in rows and len(rows) >= self.max_rows:
            del rows[next(iter(rows))]  # the oldest: a sender that gets no answers for long hears of the newest
            self.dropped_rows += 1
        counts = rows.setdefault(where, [0, 0, 0])
        total = self.totals.setdefault(sender, {}).setdefault(where[3], [0, 0, 0])
        for i, n in enumerate((received, lost, late)):
            counts[i] += n
            total[i] += n

    def report(self) -> dict[str, Any]:
        """Totals per sender and channel, for ``RUN/dgt/``."""
        return {"by_sender": {sender: {str(c): dict(zip(("received", "lost", "late"), v, strict=True))
                                       for c, v in sorted(channels.items())}
                              for sender, channels in self.totals.items()},
                "dropped_rows": self.dropped_rows}


@dataclass
class LossEstimate:
    """The sender's view of its UDP channels' loss, from the receiver's reports only."""

    weight: float = 0.3  # EWMA weight of the newest report
    min_samples: int = 50  # blocks the reports must have covered before the estimate is used
    per_channel: dict[int, float] = field(default_factory=dict)
    reports: int = 0
    samples: int = 0
    late: int = 0

    def on_report(self, rows: Sequence[FeedbackRow]) -> None:
        """Fold one report in: per channel, its loss rate over the blocks it covers moves the EWMA."""
        sums: dict[int, list[int]] = {}
        for row in rows:
            counts = sums.setdefault(row.channel, [0, 0])
            counts[0] += row.received
            counts[1] += row.lost
            self.late += row.late
        covered = False
        for channel, (received, lost) in sums.items():
            if received + lost == 0:
                continue
            rate = lost / (received + lost)
            previous = self.per_channel.get(channel)
            self.per_channel[channel] = rate if previous is None else (1 - self.weight) * previous + self.weight * rate
            self.samples += received + lost
            covered = True
        self.reports += covered

    def mean_loss(self) -> float | None:
        """The mean estimated loss over the channels reported on; None before ``min_samples`` blocks."""
        if self.samples < self.min_samples or not self.per_channel:
            return None
        return sum(self.per_channel.values()) / len(self.per_channel)
