"""ShapedLink on a fake clock: priorities, serialization + latency, pipelining, shared pipes."""

from __future__ import annotations

import itertools
import time

import pytest

from geomx.config import LinkSpec
from geomx.transport.emulator import ShapedLink

MBIT = 1e6


def drain(link: ShapedLink, now: float = 0.0, limit: int = 10_000) -> list[tuple[float, object]]:
    """Poll the link exactly when it asks to be polled, until its queue is empty."""
    delivered: list[tuple[float, object]] = []
    for _ in range(limit):
        started, wake_at = link.poll(now)
        delivered.extend(started)
        if wake_at is None:
            return delivered
        assert wake_at >= now, "the link asked to be polled in the past"
        now = wake_at
    raise AssertionError("link never drained")


def test_unlimited_link_delivers_immediately():
    link: ShapedLink[str] = ShapedLink(LinkSpec())
    for i in range(5):
        link.offer(f"m{i}", nbytes=10**9, priority=0, now=3.0)
    started, wake_at = link.poll(3.0)
    assert started == [(3.0, f"m{i}") for i in range(5)]
    assert wake_at is None
    assert len(link) == 0


def test_unlimited_link_with_latency_only():
    link: ShapedLink[str] = ShapedLink(LinkSpec(latency_s=0.05))
    link.offer("a", nbytes=10**9, priority=0, now=1.0)
    link.offer("b", nbytes=1, priority=0, now=1.0)
    started, wake_at = link.poll(1.0)
    assert started == [(pytest.approx(1.05), "a"), (pytest.approx(1.05), "b")]
    assert wake_at is None


def test_delivery_time_is_serialization_plus_latency():
    link: ShapedLink[str] = ShapedLink(LinkSpec(bandwidth_bps=8 * MBIT, latency_s=0.025))  # 1 MB/s
    link.offer("m", nbytes=100_000, priority=0, now=10.0)
    started, wake_at = link.poll(10.0)
    assert started == [(pytest.approx(10.0 + 0.1 + 0.025), "m")]
    assert wake_at is None


def test_one_message_on_the_wire_at_a_time():
    link: ShapedLink[str] = ShapedLink(LinkSpec(bandwidth_bps=8 * MBIT))  # 1 MB/s
    link.offer("a", nbytes=500_000, priority=0, now=0.0)
    link.offer("b", nbytes=500_000, priority=0, now=0.0)
    started, wake_at = link.poll(0.0)
    assert [item for _, item in started] == ["a"]  # "b" waits for the wire
    assert wake_at == pytest.approx(0.5)
    assert len(link) == 1
    # polling early starts nothing
    assert link.poll(0.3) == ([], pytest.approx(0.5))
    started, wake_at = link.poll(0.5)
    assert started == [(pytest.approx(1.0), "b")]
    assert wake_at is None


def test_latency_does_not_reduce_throughput():
    """Messages pipeline: with 100 ms latency, n back-to-back messages take n*serialization + one latency."""
    rate = 10 * MBIT
    size = 125_000  # 0.1 s each at 10 Mbit/s
    n = 20
    for latency in (0.0, 0.1, 1.0):
        link: ShapedLink[int] = ShapedLink(LinkSpec(bandwidth_bps=rate, latency_s=latency))
        for i in range(n):
            link.offer(i, nbytes=size, priority=0, now=0.0)
        delivered = drain(link)
        times = [t for t, _ in delivered]
        assert [item for _, item in delivered] == list(range(n))
        assert times == pytest.approx([(i + 1) * 0.1 + latency for i in range(n)])
        # arrivals are spaced by the serialization time, whatever the latency
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert gaps == pytest.approx([0.1] * (n - 1))
        throughput = n * size * 8 / (times[-1] - latency)
        assert throughput == pytest.approx(rate)


def test_priority_higher_first_fifo_among_equals():
    link: ShapedLink[str] = ShapedLink(LinkSpec(bandwidth_bps=8 * MBIT))
    link.offer("blocker", nbytes=1000, priority=0, now=0.0)
    assert [item for _, item in link.poll(0.0)[0]] == ["blocker"]
    # while the wire is busy, a mixed queue forms
    for name, priority in [("low1", -5), ("mid1", 0), ("high1", 7), ("mid2", 0), ("low2", -5), ("high2", 7),
                           ("mid3", 0)]:
        link.offer(name, nbytes=1000, priority=priority, now=0.0001)
    order = [item for _, item in drain(link, now=0.0001)]
    assert order == ["high1", "high2", "mid1", "mid2", "mid3", "low1", "low2"]


def test_priority_only_reorders_what_is_waiting():
    """A high-priority message does not preempt one already on the wire."""
    link: ShapedLink[str] = ShapedLink(LinkSpec(bandwidth_bps=8 * MBIT))  # 1 MB/s
    link.offer("big", nbytes=1_000_000, priority=-100, now=0.0)
    link.poll(0.0)
    link.offer("urgent", nbytes=1000, priority=100, now=0.2)
    started, wake_at = link.poll(0.2)
    assert started == [] and wake_at == pytest.approx(1.0)
    started, _ = link.poll(1.0)
    assert started == [(pytest.approx(1.001), "urgent")]


def test_idle_link_starts_at_offer_time_even_if_polled_late():
    link: ShapedLink[str] = ShapedLink(LinkSpec(bandwidth_bps=8 * MBIT, latency_s=0.01))
    link.offer("a", nbytes=100_000, priority=0, now=5.0)  # 0.1 s
    started, _ = link.poll(5.03)  # the I/O thread woke up late
    assert started == [(pytest.approx(5.0 + 0.1 + 0.01), "a")]


def test_link_idles_between_sparse_messages():
    link: ShapedLink[str] = ShapedLink(LinkSpec(bandwidth_bps=8 * MBIT))
    link.offer("a", nbytes=100_000, priority=0, now=0.0)
    assert link.poll(0.0)[0] == [(pytest.approx(0.1), "a")]
    link.offer("b", nbytes=100_000, priority=0, now=2.0)  # long after "a" left
    assert link.poll(2.0)[0] == [(pytest.approx(2.1), "b")]


@pytest.mark.parametrize("share", [1, 2, 4])
def test_share_divides_the_rate(share):
    spec = LinkSpec(bandwidth_bps=80 * MBIT, latency_s=0.005)
    link: ShapedLink[str] = ShapedLink(spec, share=share)
    assert link.rate_bps == pytest.approx(80 * MBIT / share)
    link.offer("m", nbytes=1_000_000, priority=0, now=0.0)  # 0.1 s at the full rate
    started, _ = link.poll(0.0)
    assert started == [(pytest.approx(0.1 * share + 0.005), "m")]


def test_share_does_not_change_latency_or_unlimited():
    link: ShapedLink[str] = ShapedLink(LinkSpec(latency_s=0.02), share=8)
    assert link.rate_bps is None
    link.offer("m", nbytes=10**8, priority=0, now=0.0)
    assert link.poll(0.0)[0] == [(pytest.approx(0.02), "m")]


@pytest.mark.parametrize("share", [0, -1])
def test_share_must_be_positive(share):
    with pytest.raises(ValueError, match="share"):
        ShapedLink(LinkSpec(bandwidth_bps=1e6), share=share)


def test_zero_byte_messages_take_no_wire_time():
    link: ShapedLink[int] = ShapedLink(LinkSpec(bandwidth_bps=1e3, latency_s=0.5))
    for i in range(3):
        link.offer(i, nbytes=0, priority=0, now=1.0)
    started, wake_at = link.poll(1.0)
    assert started == [(pytest.approx(1.5), 0), (pytest.approx(1.5), 1), (pytest.approx(1.5), 2)]
    assert wake_at is None


def test_len_counts_waiting_messages():
    link: ShapedLink[int] = ShapedLink(LinkSpec(bandwidth_bps=8 * MBIT))
    for i in range(4):
        link.offer(i, nbytes=1_000_000, priority=0, now=0.0)
    assert len(link) == 4
    link.poll(0.0)
    assert len(link) == 3
    drain(link)
    assert len(link) == 0


def test_hold_until_starts_the_backlog_at_the_end_of_an_outage_at_the_links_rate():
    link: ShapedLink[str] = ShapedLink(LinkSpec(bandwidth_bps=8 * MBIT, latency_s=0.01))
    for name in ("a", "b"):
        link.offer(name, nbytes=1_000_000, priority=0, now=1.0)  # 1 s each at 8 Mbit/s
    link.hold_until(5.0)
    started, wake_at = link.poll(2.0)
    assert started == [] and wake_at == 5.0
    assert drain(link, now=5.0) == [(6.0 + 0.01, "a"), (7.0 + 0.01, "b")]  # not a burst at 5 s


def test_outage_schedule_cuts_both_directions_of_the_party_for_its_window():
    from geomx.config import Outage
    from geomx.transport.emulator import OutageSchedule

    outages = (Outage("dc1", 10.0, 2.0), Outage("dc2", 30.0, 5.0))
    start = time.time()
    at_dc0 = OutageSchedule(outages, own_party="dc0", job_start=start)
    at_dc1 = OutageSchedule(outages, own_party="dc1", job_start=start)
    origin = time.monotonic()
    assert at_dc0.blocked_until("dc1", origin + 9.5) is None
    for schedule in (at_dc0, at_dc1):
        peer = "dc1" if schedule is at_dc0 else "dc0"
        until = schedule.blocked_until(peer, origin + 11.0)
        assert until == pytest.approx(origin + 12.0, abs=0.05)
        assert schedule.blocked_until(peer, origin + 12.1) is None
    assert at_dc0.blocked_until("dc2", origin + 31.0) == pytest.approx(origin + 35.0, abs=0.05)
    assert at_dc1.blocked_until("dc2", origin + 31.0) == pytest.approx(origin + 35.0, abs=0.05)  # dc2 is cut
    assert at_dc1.blocked_until("dc1", origin + 11.0) is None  # inside a party: no WAN
    assert not OutageSchedule((), "dc0", None)


def test_outage_counts_from_the_jobs_start_not_from_the_process_start():
    from geomx.config import Outage
    from geomx.transport.emulator import OutageSchedule

    late_process = OutageSchedule((Outage("dc1", 10.0, 2.0),), "dc0", job_start=time.time() - 9.0)
    now = time.monotonic()
    assert late_process.blocked_until("dc1", now + 1.5) == pytest.approx(now + 3.0, abs=0.05)


def test_background_items_share_the_link_strictly_behind_foreground_ones():
    """DGT's datagrams (background) and messages share one link: together they never exceed its rate, and a
    datagram goes only when no message is waiting."""
    link: ShapedLink[str] = ShapedLink(LinkSpec(bandwidth_bps=8 * MBIT))  # 1 MB/s
    for i in range(10):
        link.offer(f"udp{i}", nbytes=10_000, priority=-(1 + i % 2), now=0.0, background=True)
    for i in range(5):
        link.offer(f"msg{i}", nbytes=100_000, priority=-100, now=0.0)  # a lower priority than any datagram's
    delivered = drain(link)
    order = [item for _, item in delivered]
    assert order[:5] == [f"msg{i}" for i in range(5)]
    assert order[5:] == [f"udp{i}" for i in (0, 2, 4, 6, 8, 1, 3, 5, 7, 9)]  # channel 1 before channel 2
    # 600 KB at 1 MB/s: the last one is delivered at 0.6 s, not at 0.5 s (a second pipe would make it 0.1 s)
    assert delivered[-1][0] == pytest.approx(0.6)
    assert [t for t, _ in delivered] == sorted(t for t, _ in delivered)


def test_a_background_item_on_an_idle_link_is_not_preempted():
    link: ShapedLink[str] = ShapedLink(LinkSpec(bandwidth_bps=8 * MBIT))
    link.offer("udp0", nbytes=10_000, priority=-1, now=0.0, background=True)  # 0.01 s on the wire
    link.offer("udp1", nbytes=10_000, priority=-1, now=0.0, background=True)
    link.offer("msg", nbytes=10_000, priority=0, now=0.005)  # arrives while udp0 is on the wire
    delivered = drain(link, now=0.005)  # polled late: udp0 had started on the idle link at 0.0
    assert delivered == [(pytest.approx(0.01), "udp0"), (pytest.approx(0.02), "msg"), (pytest.approx(0.03), "udp1")]
    assert len(link) == 0


def test_an_outage_from_training_counts_from_the_first_training_message():
    """``from: training``: nothing is cut before training_started, then the window counts from that call
    (later calls do not move it), while a ``launch`` outage keeps counting from the job's start."""
    from geomx.config import Outage
    from geomx.transport.emulator import OutageSchedule

    schedule = OutageSchedule((Outage("dc1", 2.0, 1.0, origin="training"), Outage("dc1", 50.0, 1.0)), "dc0",
                              job_start=time.time() - 100.0)
    assert schedule  # it has outages to apply, even before training starts
    now = time.monotonic()
    assert schedule.blocked_until("dc1", now + 2.5) is None  # not armed: training has not started
    schedule.training_started(now + 10.0)
    schedule.training_started(now + 20.0)  # only the first call counts
    assert schedule.blocked_until("dc1", now + 11.9) is None
    assert schedule.blocked_until("dc1", now + 12.5) == pytest.approx(now + 13.0)
    assert schedule.blocked_until("dc1", now + 22.5) is None
    assert schedule.blocked_until("dc1", now - 49.5) == pytest.approx(now - 49.0, abs=0.05)  # the launch one
