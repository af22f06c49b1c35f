"""User-space link emulation: a bandwidth limit (one message on the wire at a time), a one-way delay and loss.

This kernel has no ``netem``, so geomx emulates its WAN inside the transport. Each sending process keeps
one ``ShapedLink`` per link class and destination party. A message waits in the link's priority queue
until the link is free, occupies it for ``bytes * 8 / rate`` seconds, and is delivered ``latency``
seconds after its last bit left. Bandwidth is therefore exact on average and latency does not eat
bandwidth (messages pipeline), as on a real long fat pipe.

The WAN between two parties is one pipe per direction, shared by the processes of the sending party that
use it: each gets ``rate / share``. Under HiPS one local server uses it alone; under a flat parameter
server every worker of the party shares it.

*Background* items (DGT's UDP datagrams) share the same pipe at strictly lower priority: one starts only when
no foreground item is waiting that could start at the same time (an item already on the wire is never
preempted, as on a real link).

Usage::

    link = ShapedLink(LinkSpec(bandwidth_bps=100e6, latency_s=0.025))
    link.offer("msg", nbytes=1_000_000, priority=0, now=time.monotonic())
    ready, wake_at = link.poll(time.monotonic())    # [(deliver_at, "msg")], next poll time
"""

from __future__ import annotations

import heapq
import itertools
import random
import time
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from ..config import LinkSpec, Outage

T = TypeVar("T")


@dataclass(order=True)
class _Queued(Generic[T]):
    neg_priority: int
    seq: int
    offered_at: float = field(compare=False)
    nbytes: int = field(compare=False)
    item: T = field(compare=False)


class ShapedLink(Generic[T]):
    """A rate-limited, delayed link. Not thread-safe: one I/O thread owns it."""

    def __init__(self, spec: LinkSpec, share: int = 1) -> None:
        if share < 1:
            raise ValueError(f"share must be at least 1, got {share}")
        self.rate_bps = None if spec.bandwidth_bps is None else spec.bandwidth_bps / share
        self.latency_s = spec.latency_s
        self._queue: list[_Queued[T]] = []
        self._background: list[_Queued[T]] = []
        self._seq = itertools.count()
        self._busy_until = 0.0

    def offer(self, item: T, nbytes: int, priority: int, now: float, background: bool = False) -> None:
        """Queue ``item`` for transmission; higher ``priority`` goes first, FIFO among equals. ``background``
        items (ordered by ``priority`` among themselves) go only when no foreground item is waiting."""
        queue = self._background if background else self._queue
        heapq.heappush(queue, _Queued(-priority, next(self._seq), now, nbytes, item))

    def hold_until(self, until: float) -> None:
        """Start nothing before ``until`` (an outage): the backlog then leaves at the link's rate, not in a burst."""
        self._busy_until = max(self._busy_until, until)

    def poll(self, now: float) -> tuple[list[tuple[float, T]], float | None]:
        """Start every transmission the link can start by ``now``.

        Returns the started items with their delivery times, and when to poll again (None: queue empty).
        """
        started: list[tuple[float, T]] = []
        while (self._queue or self._background) and self._busy_until <= now:
            queued = heapq.heappop(self._next_queue())
            start = max(self._busy_until, queued.offered_at)
            duration = 0.0 if self.rate_bps is None else queued.nbytes * 8.0 / self.rate_bps
            self._busy_until = start + duration
            started.append((self._busy_until + self.latency_s, queued.item))
        wake_at = self._busy_until if self._queue or self._background else None
        return started, wake_at

    def _next_queue(self) -> list[_Queued[T]]:
        """The foreground queue, unless the link went idle with a background item waiting before the first
        foreground item was offered (then that background item had started on the idle link already)."""
        if not self._background:
            return self._queue
        if not self._queue:
            return self._background
        foreground_start = max(self._busy_until, self._queue[0].offered_at)
        background_start = max(self._busy_until, self._background[0].offered_at)
        return self._background if background_start < foreground_start else self._queue

    def __len__(self) -> int:
        return len(self._queue) + len(self._background)


class OutageSchedule:
    """When the WAN between this process's party and another party is cut (the topology's ``outages``).

    Times in the topology count from the job's start (``job_start``, wall clock, set by ``geomx launch``;
    without it, from this object's creation) and are turned into this process's monotonic clock once. An
    outage ``from: training`` counts from ``training_started`` instead: the van calls it on the first
    training message (PUSHPULL) it sends or receives; until then that outage cuts nothing.

    Usage::

        schedule = OutageSchedule(topology.outages, own_party="dc0", job_start=topology.job_start)
        schedule.training_started(time.monotonic())                # arms the ``from: training`` ones (once)
        until = schedule.blocked_until("dc1", time.monotonic())   # None, or when the cut ends
    """

    def __init__(self, outages: tuple[Outage, ...], own_party: str, job_start: float | None) -> None:
        now = time.monotonic()
        origin = now if job_start is None else now - (time.time() - job_start)
        self._windows = [(o.party, origin + o.start_s, origin + o.end_s) for o in outages if o.origin == "launch"]
        self._from_training = [o for o in outages if o.origin == "training"]
        self._own_party = own_party

    def __bool__(self) -> bool:
        return bool(self._windows or self._from_training)

    def training_started(self, now: float) -> None:
        """Start the clock of the ``from: training`` outages at ``now`` (the first call only)."""
        pending, self._from_training = self._from_training, []
        if pending:  # one swap: the I/O thread may be reading the windows
            self._windows = self._windows + [(o.party, now + o.start_s, now + o.end_s) for o in pending]

    def blocked_until(self, peer_party: str, now: float) -> float | None:
        """The end of the outage cutting this party from ``peer_party`` at ``now``, or None if the WAN is up."""
        if peer_party == self._own_party:
            return None
        ends = [end for party, start, end in self._windows
                if party in (self._own_party, peer_party) and start <= now < end]
        return max(ends) if ends else None


class LossyChannel:
    """A seeded Bernoulli loss process for one emulated channel: the same seed drops the same datagrams.

    Usage::

        channel = LossyChannel(rate=0.05, seed=7)
        if not channel.drop():
            sock.sendto(datagram, address)
    """

    def __init__(self, rate: float, seed: int) -> None:
        if not 0.0 <= rate < 1.0:
            raise ValueError(f"a loss rate must be in [0, 1), got {rate}")
        self.rate = rate
        self._random = random.Random(seed)
        self.offered = 0
        self.dropped = 0

    def drop(self) -> bool:
        """Whether the next datagram is lost (draws from the seeded generator even at rate 0)."""
        self.offered += 1
        lost = self._random.random() < self.rate
        self.dropped += lost
        return lost
