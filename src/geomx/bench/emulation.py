"""``geomx bench --only emulation``: the WAN emulator's achieved rate against the rate it is set to.

Two vans in this process on 127.0.0.1 (a sender in party ``a``, a receiver in party ``b``), joined by an
emulated WAN link at 10 Mbit/s, 100 Mbit/s and 1 Gbit/s: the sender queues about 1.2 s worth of messages
at once and the receiver notes when each arrives. Achieved rate = bytes / (last arrival - first send).
The emulator's token bucket caps the rate; below the cap, the sender's and receiver's Python threads are
the limit: at 1 Gbit/s on a loaded 2-core machine they cannot keep up, which is why this is measured here
and not asserted in ``tests/unit/test_transport.py`` (that test checks only that no rate is exceeded, and
the lower bound where the CPU is not the limit). ``CPU %`` is this process's CPU time over the wall time:
near 100% (one core: the threads share the GIL) means the CPU, not the emulator, set the rate.

Usage::

    geomx bench --only emulation        # a few seconds
"""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..config import LinkSpec, PartySpec, Topology
from ..protocol.wire import Kind, Message, encode, frames_nbytes
from ..transport.van import Van
from .jobs import load_avg
from .sections import BenchPlan
from .tables import fmt, say, table

RATES_BPS = (10e6, 100e6, 1e9)
MESSAGE_BYTES = {10e6: 1 << 15, 100e6: 1 << 18, 1e9: 1 << 21}  # the payload per message at each rate
TARGET_S = 1.2  # seconds of traffic at the set rate
WAIT_S = 30.0  # the longest wait for the last message (a loaded machine may be far below the rate)


class _Arrivals:
    """The receiver's handler: arrival times, and an event once ``expected`` messages have arrived."""

    def __init__(self, expected: int) -> None:
        self.times: list[float] = []
        self.expected = expected
        self.done = threading.Event()

    def __call__(self, message: Message) -> None:
        self.times.append(time.monotonic())
        if len(self.times) >= self.expected:
            self.done.set()


def measure_rate(rate_bps: float, message_bytes: int, target_s: float = TARGET_S) -> dict[str, Any]:
    """Send ``target_s`` worth of ``message_bytes`` messages over a ``rate_bps`` emulated WAN; the achieved rate.

    Usage: ``measure_rate(100e6, 1 << 18)["achieved_bps"]``.
    """
    topology = Topology(parties=(PartySpec("a", 1), PartySpec("b", 1)), central="a",
                        wan=LinkSpec(bandwidth_bps=rate_bps))
    payload = np.zeros(message_bytes, np.uint8)  # one buffer for every send, never mutated
    message_nbytes = frames_nbytes(encode(Message(Kind.PUSHPULL, tensor=payload)))
    count = math.ceil(target_s * rate_bps / 8 / message_nbytes)
    arrivals = _Arrivals(count)
    sender = Van("a/sender", party="a", topology=topology, handler=lambda _message: None)
    receiver = Van("b/receiver", party="b", topology=topology, handler=arrivals)
    vans = [sender, receiver]
    try:
        for van in vans:
            van.start()
        sender.add_peer(receiver.identity, receiver.address, party="b")
        receiver.add_peer(sender.identity, sender.address, party="a")
        cpu_start, first_send = time.process_time(), time.monotonic()
        for key in range(count):
            sender.send(receiver.identity, Message(Kind.PUSHPULL, key=key, tensor=payload))
        arrived = arrivals.done.wait(WAIT_S)
        wall = time.monotonic() - first_send
        cpu = time.process_time() - cpu_start
    finally:
        for van in reversed(vans):
            van.stop(flush_timeout=1.0)
    total = count * message_nbytes
    last = max(arrivals.times) if arrivals.times else None
    achieved = total * 8 / (last - first_send) if arrived and last is not None else None
    return {"rate_bps": rate_bps, "message_bytes": message_bytes, "messages": count, "bytes": total,
            "arrived": len(arrivals.times), "achieved_bps": achieved,
            "achieved_over_set": None if achieved is None else achieved / rate_bps,
            "cpu_share": cpu / wall if wall > 0 else None, "load_avg_after": load_avg()}


def run(plan: BenchPlan, out_dir: Path) -> dict[str, Any]:
    """The section's entry point: every rate once (``--quick`` changes nothing: it takes seconds)."""
    rows, errors = [], []
    for rate in RATES_BPS:
        say(f"[emulation] {rate / 1e6:g} Mbit/s: {TARGET_S:g} s of {MESSAGE_BYTES[rate] >> 10} KiB messages ...")
        row = measure_rate(rate, MESSAGE_BYTES[rate])
        if row["achieved_bps"] is None:
            errors.append(f"{rate / 1e6:g} Mbit/s: {row['arrived']} of {row['messages']} messages arrived "
                          f"within {WAIT_S:g} s")
        rows.append(row)
    return {"setup": {"target_s": TARGET_S, "vans": "2 in one process, 127.0.0.1, one emulated WAN link"},
            "rows": rows, "errors": errors}


def lines(section: dict[str, Any]) -> list[str]:
    """The section's table for ``geomx bench``'s report."""
    out = [f"[emulation] 2 vans in one process over an emulated WAN link on 127.0.0.1; "
           f"{section['setup']['target_s']:g} s of traffic at the set rate, queued at once"]
    rows = [[f"{row['rate_bps'] / 1e6:g} Mbit/s", f"{row['message_bytes'] >> 10} KiB", str(row["messages"]),
             fmt(None if row["achieved_bps"] is None else row["achieved_bps"] / 1e6, ".1f"),
             fmt(row["achieved_over_set"], ".3f"), fmt(None if row["cpu_share"] is None else 100 * row["cpu_share"],
                                                       ".0f", "%")]
            for row in section.get("rows", [])]
    out += table(["set rate", "message", "messages", "achieved Mbit/s", "achieved/set", "CPU %"], rows)
    out.append("note: achieved = bytes / (last arrival - first send); above 1.0 the emulator let too much through; "
               "well below 1.0 with CPU % near 100: the CPU, not the emulator, was the limit.")
    out += [f"error: {error}" for error in section.get("errors", [])]
    return out
