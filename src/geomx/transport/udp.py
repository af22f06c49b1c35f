"""UDP channels for DGT: a validated datagram format, the sending socket and a receiver thread.

DGT (``geomx.algorithms.dgt``) sends a push's less important blocks as one datagram each. Nothing here knows what a
block means. Datagrams leave through the sender's van (``geomx.transport.van.Van.send_datagram``), which shapes
them with its messages (behind them) and counts their bytes. Datagrams are raw bytes with a fixed header,
never pickled; anything malformed is counted and dropped.

Usage::

    receiver = UdpReceiver("127.0.0.1", 0, handler=print, tick=lambda now: None); receiver.start()
    data = encode_datagram(Datagram("dc1/server", 3, 0, 7, 12, 1, 4096, values))
    van.send_datagram(global_server_id, ("127.0.0.1", receiver.port), data, channel=1)
"""

from __future__ import annotations

import logging
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .counters import DatagramCounts

log = logging.getLogger("geomx.transport.udp")

VERSION = 1
MAX_DATAGRAM = 65_000
# magic, version, channel, key, slice, round, block index, element offset, sender id length
_HEADER = struct.Struct("<2sBBqIQIQH")
_MAGIC = b"GD"


class DatagramError(ValueError):
    """Bytes that are not a valid DGT datagram."""


@dataclass
class Datagram:
    """One block of one slice's push: ``values`` (float32) start at element ``offset`` of the slice."""

    sender: str
    key: int
    slice: int
    round: int
    block: int
    channel: int
    offset: int
    values: np.ndarray = field(repr=False)
    nbytes: int = 0  # its size on the wire (set by decode_datagram)


def encode_datagram(d: Datagram) -> bytes:
    """The datagram's bytes; refuses what would not fit in one UDP datagram."""
    sender = d.sender.encode()
    payload = np.ascontiguousarray(d.values, dtype=np.float32).tobytes()
    data = _HEADER.pack(_MAGIC, VERSION, d.channel, d.key, d.slice, d.round, d.block, d.offset, len(sender))
    data += sender + payload
    if len(data) > MAX_DATAGRAM:
        raise DatagramError(f"a datagram of {len(data)} bytes exceeds {MAX_DATAGRAM}; use smaller DGT blocks")
    return data


def decode_datagram(data: bytes) -> Datagram:
    """Parse and validate ``data``; raises DatagramError naming what is wrong."""
    if len(data) < _HEADER.size:
        raise DatagramError(f"{len(data)} bytes is shorter than the {_HEADER.size}-byte header")
    magic, version, channel, key, index, rnd, block, offset, sender_len = _HEADER.unpack_from(data)
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
    return Datagram(sender, key, index, rnd, block, channel, offset, np.frombuffer(payload, dtype=np.float32),
                    len(data))


class UdpSender:
    """The van's UDP socket for DGT datagrams (opened on first use; the van's I/O thread only): sends what
    crossed the emulated link, drops what the emulated loss took, and counts both in ``counts``.

    Usage: ``sender = UdpSender(van.datagrams, "dc1/server"); sender.send(data, ("127.0.0.1", 41235), lost=False)``
    """

    def __init__(self, counts: DatagramCounts, name: str) -> None:
        self.counts = counts
        self.name = name
        self._sock: socket.socket | None = None

    def send(self, data: bytes, address: tuple[str, int], lost: bool) -> bool:
        """Hand ``data`` to the socket for ``address`` (not if ``lost``); False if the socket refused it."""
        if self._sock is None:
            self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        if not lost:
            try:
                self._sock.sendto(data, address)
            except OSError as exc:
                self.counts.errors += 1
                log.warning("[%s] UDP send to %s failed: %s", self.name, address, exc)
                return False
        else:
            self.counts.lost += 1
        self.counts.sent += 1
        self.counts.sent_bytes += len(data)
        return True

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()


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
