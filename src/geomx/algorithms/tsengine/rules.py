"""TSEngine's overlays: who sends a round's pushes and its result to whom, chosen online from measured throughput.

**Aggregation** (GeoMX's ASKPUSH): a local server with its party's sum asks the coordinator (the global server
owning the slice) where to send it. If the global server is not receiving another push, there; otherwise it
waits, and two waiting local servers are paired: one sends its sum to the other (the faster measured
direction, ε-greedy), which adds it and asks again. Pushes pre-merge while the global server's link is busy.

**Dissemination**: after a global round, the global server that owns the (key, slice) coordinates its
dissemination to the local servers (``ENABLE_INTER_TS``). Every node that holds the new value (the global
server first, then each local server that received it) serves one unserved local server at a time; for each hand-off the
coordinator picks the target **ε-greedily**: with probability ``1 - max_greed`` a uniformly random unserved
node (exploration), otherwise the one with the best measured throughput from that holder (exploitation;
a holder with no measured link to any unserved node explores by necessity, counted apart). Throughput is
bytes over **wall-clock** time from the coordinator's instruction to the receiver's acknowledgement, kept
as an EMA per directed link. Holders relay in parallel, so a dynamic broadcast tree forms and a narrow
global-server link carries fewer copies than a star's N. (GeoMX: integer division makes its greed rate 0
or 1, so it never explores once links are known; it measures CPU time with ``clock()``.)

Usage::

    coordinator = Coordinator(max_greed=0.9, seed=0)
    round_ = coordinator.start("gs", {"ls1": 4, "ls2": 4}, nbytes=4096)   # targets -> their round numbers
    target = coordinator.next_target(round_, holder="gs")                 # "ls1" or "ls2"
    coordinator.acknowledged(round_, target)                              # measures gs -> target
    coordinator.ask_push(PushPairing(), "ls1")                            # [("ls1", None)]: to the server
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...runs import runlog

EMA = 0.5


@dataclass
class Dissemination:
    """One round's result on its way to every local server."""

    root: str
    targets: dict[str, int]  # local server -> the round number it waits for
    nbytes: int
    unserved: set[str] = field(default_factory=set)
    in_flight: dict[str, tuple[str, float]] = field(default_factory=dict)  # target -> (holder, sent at)
    started_at: float = 0.0
    hops: list[tuple[str, str]] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return not self.unserved and not self.in_flight


@dataclass
class PushPairing:
    """One (key, slice)'s aggregation overlay: whether the global server is receiving a push, who waits."""

    waiting: list[str] = field(default_factory=list)
    pushing: str | None = None  # who was last told to push to the server; None: the server's link is free

    @property
    def busy(self) -> bool:
        return self.pushing is not None


@dataclass
class Choices:
    explore: int = 0
    exploit: int = 0
    forced: int = 0  # no known link from the holder to any unserved node


class Coordinator:
    """The ε-greedy overlay builder. Not thread-safe: the global server calls it under its lock."""

    def __init__(self, max_greed: float, seed: int = 0, clock: Callable[[], float] = time.monotonic) -> None:
        if not 0.0 <= max_greed <= 1.0:
            raise ValueError(f"MAX_GREED_RATE_TS must be in [0, 1], got {max_greed}")
        self.max_greed = max_greed
        self._random = random.Random(seed)
        self._clock = clock
        self.throughput: dict[tuple[str, str], float] = {}  # (from, to) -> bytes per second (EMA)
        self.choices = Choices()
        self.rounds_done = 0
        self.seconds_total = 0.0  # dissemination time summed over finished rounds
        self.merges = 0  # pushes merged into another local server's instead of sent to the global server

    def start(self, root: str, targets: dict[str, int], nbytes: int) -> Dissemination:
        return Dissemination(root, dict(targets), nbytes, set(targets), started_at=self._clock())

    def choose(self, holder: str, candidates: list[str]) -> str:
        """ε-greedy: explore with probability 1 - max_greed, else the best measured link from ``holder``."""
        known = [c for c in candidates if (holder, c) in self.throughput]
        if not known:
            self.choices.forced += 1
            return self._random.choice(candidates)
        if self._random.random() >= self.max_greed:
            self.choices.explore += 1
            return self._random.choice(candidates)
        self.choices.exploit += 1
        return max(known, key=lambda c: (self.throughput[(holder, c)], c))

    def next_target(self, round_: Dissemination, holder: str) -> str | None:
        """The unserved node ``holder`` should send to next (marked in flight), or None when none is left."""
        if not round_.unserved:
            return None
        target = self.choose(holder, sorted(round_.unserved))
        round_.unserved.discard(target)
        round_.in_flight[target] = (holder, self._clock())
        round_.hops.append((holder, target))
        return target

    def acknowledged(self, round_: Dissemination, target: str) -> str | None:
        """``target`` has the value: measure its link; returns the holder that sent it (None if unexpected)."""
        entry = round_.in_flight.pop(target, None)
        if entry is None:
            return None
        holder, sent_at = entry
        rate = round_.nbytes / max(self._clock() - sent_at, 1e-6)
        previous = self.throughput.get((holder, target))
        self.throughput[(holder, target)] = rate if previous is None else EMA * previous + (1 - EMA) * rate
        self._count_if_done(round_)
        return holder

    def _count_if_done(self, round_: Dissemination) -> None:
        """A round that just reached every target counts in the report (rounds, time to disseminate)."""
        if round_.done:
            self.rounds_done += 1
            self.seconds_total += self._clock() - round_.started_at

    # -- aggregation (GeoMX's ASKPUSH) ----------------------------------------------------------------------
    def ask_push(self, pairing: PushPairing, asker: str) -> list[tuple[str, str | None]]:
        """``asker`` holds a (partial) sum. Instructions ``(node, target)``: target None means "send it to the
        global server"; otherwise node sends its sum to target, which adds it to its own and asks again.
        While the global server receives one push, waiting local servers pair up and pre-merge."""
        if not pairing.busy:
            pairing.pushing = asker
            return [(asker, None)]
        if pairing.waiting:
            other = pairing.waiting.pop(0)
            self.merges += 1
            return [self.merge_direction(asker, other)]
        pairing.waiting.append(asker)
        return []

    def pushed(self, pairing: PushPairing) -> list[tuple[str, str | None]]:
        """The global server received a push: the next waiting local server may send."""
        pairing.pushing = pairing.waiting.pop(0) if pairing.waiting else None
        return [] if pairing.pushing is None else [(pairing.pushing, None)]

    # -- a client dropped (elastic FSA) -------------------------------------------------------------------
    def forget_pusher(self, pairing: PushPairing, node: str) -> list[tuple[str, str | None]]:
        """``node`` is gone: it no longer waits, and if the server was waiting for its push, the next may send."""
        if node in pairing.waiting:
            pairing.waiting.remove(node)
        if pairing.pushing == node:
            return self.pushed(pairing)
        return []

    def forget_target(self, round_: Dissemination, node: str) -> list[str]:
        """``node`` is gone: it is no longer a target, and what it was relaying goes back to the unserved.
        Returns the holders that should send again (the root when nobody else is sending)."""
        round_.unserved.discard(node)
        holders = []
        entry = round_.in_flight.pop(node, None)
        if entry is not None:
            holders.append(entry[0])
        for target, (holder, _) in list(round_.in_flight.items()):
            if holder == node:
                del round_.in_flight[target]
                round_.unserved.add(target)
        if round_.unserved and not round_.in_flight and round_.root not in holders:
            holders.append(round_.root)
        self._count_if_done(round_)
        return [h for h in holders if h != node]

    def merge_direction(self, a: str, b: str) -> tuple[str, str]:
        """(sender, receiver) of a merge: the faster measured direction, ε-greedy (random when exploring or
        when a direction is unmeasured)."""
        forward, backward = self.throughput.get((a, b)), self.throughput.get((b, a))
        if forward is None or backward is None or self._random.random() >= self.max_greed:
            return (a, b) if self._random.random() < 0.5 else (b, a)
        return (a, b) if forward >= backward else (b, a)

    def report(self) -> dict[str, Any]:
        return {"rounds": self.rounds_done, "merges": self.merges, "explore": self.choices.explore,
                "exploit": self.choices.exploit,
                "forced": self.choices.forced, "max_greed": self.max_greed,
                "mean_disseminate_s": self.seconds_total / self.rounds_done if self.rounds_done else None,
                "throughput": {f"{a}->{b}": rate for (a, b), rate in sorted(self.throughput.items())}}


def write_report(run_dir: Path, name: str, report: dict[str, Any]) -> Path:
    """Write a global server's TSEngine report to ``RUN/tsengine/<name>.json`` (read by tests and the bench)."""
    return runlog.write_report(run_dir, "tsengine", name, report)


def read_reports(run_dir: Path) -> dict[str, dict[str, Any]]:
    """Every tsengine report of a run, by file stem."""
    return runlog.read_reports(run_dir, "tsengine")
