"""What a van counts: bytes per link class and per peer, and DGT's datagrams.

Usage::

    counters = ByteCounters()
    counters.add("dc1/server/ab12", WAN, "sent", 4096)
    counters.snapshot()["wan"]                      # {"sent": 4096, "recv": 0}
    counters.add_saved(WAN, 3000); counters.saved_bytes()   # {"lan": 0, "wan": 3000}: what a codec kept off
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Any

from ..protocol.wire import Message

LAN = "lan"
WAN = "wan"


def codec_saving(message: Message) -> int | None:
    """How many bytes ``message``'s codec kept off the link: its dense tensor's size less its encoded frames (None
    for a message not encoded)."""
    if message.encoded is None or message.dtype is None:
        return None
    sent = sum(f.nbytes if hasattr(f, "nbytes") else len(f) for f in message.encoded)
    return math.prod(message.shape) * message.dtype.itemsize - sent


@dataclass
class DatagramCounts:
    """DGT datagrams that left this process (I/O thread only): ``sent`` and ``sent_bytes`` count every datagram
    that crossed the emulated link, ``lost`` those of them the emulated loss dropped after it (never handed to
    the socket), ``lost_to_outage`` those due while the WAN was cut."""

    sent: int = 0
    sent_bytes: int = 0
    lost: int = 0
    lost_to_outage: int = 0
    errors: int = 0


@dataclass
class ByteCounters:
    """Bytes sent and received, per link class and per peer. Updated by the I/O thread only."""

    by_class: dict[str, dict[str, int]] = field(
        default_factory=lambda: {LAN: {"sent": 0, "recv": 0}, WAN: {"sent": 0, "recv": 0}})
    by_peer: dict[str, dict[str, Any]] = field(default_factory=dict)
    # bytes a codec kept off each link class: the decoded size of each encoded message sent, less its frames
    saved: dict[str, int] = field(default_factory=lambda: {LAN: 0, WAN: 0})
    # the I/O thread and a DGT receiver thread (UDP receipts) both add
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, peer: str, link_class: str, direction: str, nbytes: int) -> None:
        with self._lock:
            self.by_class[link_class][direction] += nbytes
            entry = self.by_peer.get(peer)
            if entry is None:
                entry = self.by_peer[peer] = {"class": link_class, "sent": 0, "recv": 0}
            entry[direction] += nbytes

    def add_saved(self, link_class: str, nbytes: int) -> None:
        """A codec sent a message ``nbytes`` smaller than its dense tensor over ``link_class`` (never below 0)."""
        with self._lock:
            self.saved[link_class] += max(0, nbytes)

    def saved_bytes(self) -> dict[str, int]:
        """``{"lan": ..., "wan": ...}``: what the codecs saved on each link class so far."""
        with self._lock:
            return dict(self.saved)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {"lan": dict(self.by_class[LAN]), "wan": dict(self.by_class[WAN]),
                    "peers": {name: dict(entry) for name, entry in self.by_peer.items()}}
