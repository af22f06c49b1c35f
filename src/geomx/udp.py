"""UDP channels for DGT: a validated datagram format, a paced lossy sender and a receiver thread.

DGT (``geomx.dgt``) sends a push's less important blocks as one datagram each. Nothing here knows what a
block means. The sender paces datagrams through the WAN emulator (``ShapedLink``: rate and delay; even
loopback drops unpaced bursts) in channel priority order, and each channel drops datagrams with its seeded
loss rate (``LossyChannel``), so tests reproduce losses. Datagrams are raw bytes with a fixed header, never
pickled; anything malformed is counted and dropped.

Usage::

    receiver = UdpReceiver("127.0.0.1", 0, handler=print, tick=lambda now: None); receiver.start()
    sender = PacedSender(LinkSpec(100e6, 0.01), {1: LossyChannel(0.01, seed=1)}, name="dc1/server")
    sender.start(); sender.send(("127.0.0.1", receiver.port), Datagram("dc1/server", 3, 0, 7, 12, 1, 4096, values))
"""

from __future__ import annotations

import heapq
import itertools
import logging
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .config import LinkSpec
from .emulator import LossyChannel, ShapedLink

log = logging.getLogger("geomx.udp")

VERSION = 1
MAX_DATAGRAM = 65_000
# magic, version, channel, key, part, round, block index, element offset, sender id length
_HEADER = struct.Struct("<2sBBqIQIQH")
_MAGIC = b"GD"


class DatagramError(ValueError):
    """Bytes that are not a valid DGT datagram."""


@dataclass
class Datagram:
    """One block of one slice's push: ``values`` (float32) start at element ``offset`` of the slice."""

    sender: str
    key: int
    part: int
    round: int
    block: int
    channel: int
    offset: int
    values: np.ndarray = field(repr=False)


def encode_datagram(d: Datagram) -> bytes:
    """The datagram's bytes; refuses what would not fit in one UDP datagram."""
    sender = d.sender.encode()
    payload = np.ascontiguousarray(d.values, dtype=np.float32).tobytes()
    data = _HEADER.pack(_MAGIC, VERSION, d.channel, d.key, d.part, d.round, d.block, d.offset, len(sender))
    data += sender + payload
    if len(data) > MAX_DATAGRAM:
        raise DatagramError(f"a datagram of {len(data)} bytes exceeds {MAX_DATAGRAM}; use smaller DGT blocks")
    return data


def decode_datagram(data: bytes) -> Datagram:
    """Parse and validate ``data``; raises DatagramError naming what is wrong."""
    if len(data) < _HEADER.size:
        raise DatagramError(f"{len(data)} bytes is shorter than the {_HEADER.size}-byte header")
    magic, version, channel, key, part, rnd, block, offset, sender_len = _HEADER.unpack_from(data)
    if magic != _MAGIC:
        raise DatagramError(f"bad magic {magic!r}")
    if version != VERSION:
        raise DatagramError(f"unsupported datagram version {version} (this is {VERSION})")
    body = data[_HEADER.size:]
    if sender_len > len(body) or sender_len == 0:
        raise DatagramError(f"sender id of {sender_len} bytes does not fit in {len(body)} bytes")
    payload = body[sender_len:]
    if len(payload) % 4:
        raise DatagramError(f"payload of {len(payload)} bytes is not whole float32 values")
    try:
        sender = body[:sender_len].decode()
    except UnicodeDecodeError:
        raise DatagramError("sender id is not UTF-8") from None
    return Datagram(sender, key, part, rnd, block, channel, offset, np.frombuffer(payload, dtype=np.float32))


class UdpReceiver:
    """Binds a UDP socket; one thread hands every valid datagram to ``handler`` and calls ``tick(now)``
    at least every ``tick_s`` (DGT's deadlines)."""

    def __init__(self, host: str, port: int, handler: Callable[[Datagram], None],
                 tick: Callable[[float], None], tick_s: float = 0.005, name: str = "udp") -> None:
        self.name = name
        self._handler = handler
        self._tick = tick
        self._tick_s = tick_s
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        try:
            self._sock.bind((host, port))
        except OSError as exc:
            self._sock.close()
            raise RuntimeError(f"{name}: cannot bind UDP {host}:{port} for DGT: {exc}") from exc
        self._sock.setblocking(False)
        self.port: int = self._sock.getsockname()[1]
        self.malformed = 0
        self.received = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"{name}-udp-recv", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sock.close()

    def _loop(self) -> None:
        while not self._stop.is_set():
            readable, _, _ = select.select([self._sock], [], [], self._tick_s)
            if readable:
                for _ in range(1024):
                    try:
                        data = self._sock.recv(MAX_DATAGRAM + 1)
                    except (BlockingIOError, InterruptedError):
                        break
                    except OSError:
                        return  # closed
                    try:
                        datagram = decode_datagram(data)
                    except DatagramError as exc:
                        self.malformed += 1
                        log.warning("[%s] dropped a malformed datagram: %s", self.name, exc)
                        continue
                    self.received += 1
                    try:
                        self._handler(datagram)
                    except Exception:  # a handler bug must not stop the channel
                        log.exception("[%s] DGT handler failed", self.name)
            try:
                self._tick(time.monotonic())
            except Exception:
                log.exception("[%s] DGT deadline handler failed", self.name)


class PacedSender:
    """Sends datagrams through a shaped link (rate, delay; lower channel first) with per-channel loss.

    ``cut(now)``: whether the emulated WAN is down at ``now`` (an outage): datagrams due then are lost, as on a
    real link (ZeroMQ messages wait for the link instead; see geomx.transport).
    """

    def __init__(self, link: LinkSpec, channels: dict[int, LossyChannel], name: str = "udp",
                 cut: Callable[[float], bool] | None = None) -> None:
        self.name = name
        self._cut = cut
        self.lost_to_outage = 0
        self._link: ShapedLink[tuple[tuple[str, int], bytes, int]] = ShapedLink(link)
        self._channels = channels
        self._due: list[tuple[float, int, tuple[str, int], bytes]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._stop = False
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        self.sent = 0
        self.sent_bytes = 0
        self.send_errors = 0
        self._thread = threading.Thread(target=self._loop, name=f"{name}-udp-send", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def send(self, address: tuple[str, int], datagram: Datagram) -> bool:
        """Queue ``datagram`` unless its channel's emulated loss drops it; False when dropped."""
        data = encode_datagram(datagram)
        if self._channels[datagram.channel].drop():
            return False
        with self._cond:
            self._link.offer((address, data, datagram.channel), len(data), -datagram.channel, time.monotonic())
            self._cond.notify()
        return True

    def idle(self) -> bool:
        with self._cond:
            return not self._due and len(self._link) == 0

    def stop(self, flush_s: float = 2.0) -> None:
        deadline = time.monotonic() + flush_s
        while not self.idle() and time.monotonic() < deadline:
            time.sleep(0.005)
        with self._cond:
            self._stop = True
            self._cond.notify()
        self._thread.join(timeout=5)
        self._sock.close()

    def _loop(self) -> None:
        while True:
            with self._cond:
                if self._stop:
                    return
                now = time.monotonic()
                started, wake_at = self._link.poll(now)
                for deliver_at, (address, data, _) in started:
                    heapq.heappush(self._due, (deliver_at, next(self._seq), address, data))
                ready = []
                while self._due and self._due[0][0] <= now:
                    _, _, address, data = heapq.heappop(self._due)
                    ready.append((address, data))
                if self._due:
                    wake_at = self._due[0][0] if wake_at is None else min(wake_at, self._due[0][0])
                if not ready:
                    self._cond.wait(0.2 if wake_at is None else max(0.0, wake_at - now))
                    continue
            if self._cut is not None and self._cut(now):
                self.lost_to_outage += len(ready)
                continue
            for address, data in ready:
                try:
                    self._sock.sendto(data, address)
                    self.sent += 1
                    self.sent_bytes += len(data)
                except OSError as exc:
                    self.send_errors += 1
                    log.warning("[%s] UDP send to %s failed: %s", self.name, address, exc)
