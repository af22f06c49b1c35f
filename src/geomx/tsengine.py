"""TSEngine's dissemination overlay: who sends a round's result to whom, chosen online from measured throughput.

After a global round, the global server that owns the (key, slice) coordinates its dissemination to the
local servers (``ENABLE_INTER_TS``). Every node that holds the new value (the global server first, then
each local server that received it) serves one unserved local server at a time; for each hand-off the
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
    coordinator.acknowledged(round_, holder="gs", target=target)          # measures gs -> target
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
        self.seconds: list[float] = []  # dissemination time of each finished round

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
        if round_.done:
            self.rounds_done += 1
            self.seconds.append(self._clock() - round_.started_at)
        return holder

    def report(self) -> dict[str, Any]:
        return {"rounds": self.rounds_done, "explore": self.choices.explore, "exploit": self.choices.exploit,
                "forced": self.choices.forced, "max_greed": self.max_greed,
                "mean_disseminate_s": sum(self.seconds) / len(self.seconds) if self.seconds else None,
                "throughput": {f"{a}->{b}": rate for (a, b), rate in sorted(self.throughput.items())}}


def write_report(run_dir: Path, name: str, report: dict[str, Any]) -> Path:
    """Write a global server's TSEngine report to ``RUN/tsengine/<name>.json`` (read by tests and the bench)."""
    folder = run_dir / "tsengine"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name.replace('/', '_')}.json"
    path.write_text(json.dumps(report))
    return path


def read_reports(run_dir: Path) -> dict[str, dict[str, Any]]:
    folder = run_dir / "tsengine"
    return {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))} if folder.is_dir() else {}
