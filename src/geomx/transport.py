"""The van: ZeroMQ sockets, per-link emulation and priority queues, byte counters.

Each process has one ``Van``. It receives every inbound message on one ROUTER socket and sends through
one DEALER socket per peer (the DEALER's identity is this node's id, so the receiver knows the sender).
One I/O thread owns all sockets; one dispatch thread runs the node's handler, so a slow handler never
stops bytes from moving. ``send`` may be called from any thread.

DGT's UDP datagrams (``send_datagram``) take the same emulated links as the messages to their peer (the
party's access link included) at strictly lower priority than any message, and count in the same byte
counters: UDP is not a second pipe next to the WAN.

Usage::

    van = Van("dc1/worker/ab12", party="dc1", topology=topology, handler=on_message)
    address = van.start()                     # "tcp://127.0.0.1:41234"
    van.add_peer("dc1/server/cd34", "tcp://127.0.0.1:41235", party="dc1")
    van.send("dc1/server/cd34", Message(Kind.PULL, key=0))
    van.stop()
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import zmq

from .config import LinkSpec, Topology
from .emulator import OutageSchedule, ShapedLink
from .security import Guard
from .trace import Tracer
from .wire import Kind, Message, WireError, decode, encode, frames_nbytes

log = logging.getLogger("geomx.transport")

Handler = Callable[[Message], None]
Delivery = Callable[[], None]  # a received DGT datagram's handling, run once it passed the node's ingress
Hook = Callable[[Message], bool]  # True: the message was consumed

LAN = "lan"
WAN = "wan"
DISPATCH_POLL_S = 1.0  # how often an idle dispatch thread checks that the I/O thread still delivers


def _earliest(*times: float | None) -> float | None:
    """The earliest of the given wake-up times that are set (None if none is)."""
    return min((t for t in times if t is not None), default=None)


@dataclass
class _Peer:
    identity: str
    address: str
    party: str
    link_class: str
    link_key: tuple[str, str]


@dataclass
class _Outgoing:
    peer: str
    frames: list[Any]
    nbytes: int
    ready_at: float = 0.0  # when its last bit left the party's access link (delivery is not earlier + latency)
    udp: tuple[str, int] | None = None  # a DGT datagram (frames == [bytes]) to this UDP address
    lost: bool = False  # the datagram is lost on the way (emulated loss): it takes the link, then vanishes
    tag: tuple[str, int, int, int, bool] | None = None  # (kind, key, part, round, reply) when tracing


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
    # the I/O thread and a DGT receiver thread (UDP receipts) both add
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, peer: str, link_class: str, direction: str, nbytes: int) -> None:
        with self._lock:
            self.by_class[link_class][direction] += nbytes
            entry = self.by_peer.setdefault(peer, {"class": link_class, "sent": 0, "recv": 0})
            entry[direction] += nbytes

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {"lan": dict(self.by_class[LAN]), "wan": dict(self.by_class[WAN]),
                    "peers": {name: dict(entry) for name, entry in self.by_peer.items()}}


class Van:
    """Sockets, emulation and counters for one node. See the module docstring."""

    def __init__(self, identity: str, party: str, topology: Topology, handler: Handler,
                 bind_host: str = "127.0.0.1", bind_port: int = 0, name: str | None = None) -> None:
        self.identity = identity
        self.party = party
        self.name = name or identity
        self._topology = topology
        self._handler = handler
        self._bind_host = bind_host
        self._bind_port = bind_port
        self._context = zmq.Context()
        self._peers: dict[str, _Peer] = {}
        self._gone: set[str] = set()  # peers disconnected for good (see disconnect)
        self._sockets: dict[str, zmq.Socket[Any]] = {}
        self._links: dict[tuple[str, str], ShapedLink[_Outgoing]] = {}
        self._outages = OutageSchedule(topology.outages, party, topology.job_start)
        # The party's own connection to the WAN (topology ``access``), shared by all WAN traffic per direction:
        # sends pass it on their way into their destination's pipe, receipts before they are handled.
        self._access_bps = topology.access_bps(party)
        self._access_share = 1
        self._access_out: ShapedLink[tuple[_Outgoing, int]] | None = None
        self._access_in: ShapedLink[Message | Delivery] | None = None
        # The node's inbound LAN side (``links.lan.ingress``): LAN receipts queue there like WAN ones at the access
        # link, so workers sending to their local server at once share its rate.
        lan = topology.lan
        self._lan_in: ShapedLink[Message | Delivery] | None = (
            ShapedLink(LinkSpec(lan.bandwidth_bps)) if lan.ingress and lan.bandwidth_bps else None)
        self._inbound: list[tuple[float, int, Message | Delivery]] = []
        self._due: list[tuple[float, int, _Outgoing]] = []
        self._due_seq = itertools.count()
        self._commands: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._inbox: queue.SimpleQueue[Message | Delivery | None] = queue.SimpleQueue()
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        os.set_blocking(self._wake_write, False)
        self._stopping = threading.Event()
        self._idle = threading.Event()
        self._started = threading.Event()
        self._start_error: BaseException | None = None
        self._threads: list[threading.Thread] = []
        self.counters = ByteCounters()
        self.datagrams = DatagramCounts()
        self._udp_sock: socket.socket | None = None  # DGT datagrams (opened on first use by the I/O thread)
        # Datagrams to a peer whose links set no rate are paced here (even loopback drops unpaced bursts).
        pace = topology.dgt.rate_bps if topology.dgt is not None else None
        self._udp_pace: ShapedLink[tuple[_Outgoing, int]] | None = ShapedLink(LinkSpec(pace)) if pace else None
        self.address = ""
        self.malformed = 0
        # refuses peers without the shared secret / CURVE key during the handshake (see geomx.security)
        self.guard = Guard(topology.security, party, name=self.name)
        # sees HEARTBEAT messages first, on the I/O thread, so a slow handler never delays them
        self.heartbeat_hook: Hook | None = None
        self._stop_hooks: list[Callable[[], None]] = []
        # GEOMX_TRACE=1 (see geomx.trace): the node sets this; None costs one test per message event
        self.tracer: Tracer | None = None

    # -- public API ---------------------------------------------------------------------------------------
    def start(self) -> str:
        """Bind the ROUTER socket and start the threads; returns the bound address."""
        io = threading.Thread(target=self._io_loop, name=f"{self.name}-io", daemon=True)
        dispatch = threading.Thread(target=self._dispatch_loop, name=f"{self.name}-dispatch", daemon=True)
        self._threads = [io, dispatch]
        io.start()
        if not self._started.wait(10):
            raise RuntimeError(f"{self.name}: transport did not start within 10 s")
        if self._start_error is not None:
            raise self._start_error
        dispatch.start()
        return self.address

    def add_peer(self, identity: str, address: str, party: str, share: int = 1) -> None:
        """Connect to a peer. ``share``: how many processes of this party share the WAN pipe to its party."""
        if identity in self._peers:
            return
        link_class = LAN if party == self.party else WAN
        link_key = (link_class, party if link_class == WAN else self.party)
        peer = _Peer(identity, address, party, link_class, link_key)
        self._peers[identity] = peer
        self._commands.put(("connect", (peer, share)))
        self._wake()

    def disconnect(self, identity: str) -> None:
        """Close the connection to a peer that is gone for good (declared dead and dropped): ZeroMQ would keep
        what is queued for it, and retry connecting, forever. Later sends to it are dropped without error."""
        if identity not in self._peers or identity in self._gone:
            return
        self._gone.add(identity)
        self._commands.put(("disconnect", identity))
        self._wake()

    @property
    def outages(self) -> OutageSchedule:
        """This process's emulated WAN outages (armed by the first training message through this van)."""
        return self._outages

    @property
    def topology(self) -> Topology:
        return self._topology

    def knows(self, identity: str) -> bool:
        return identity in self._peers

    def peer_party(self, identity: str) -> str | None:
        peer = self._peers.get(identity)
        return peer.party if peer else None

    def send(self, peer: str, message: Message) -> None:
        """Queue ``message`` to ``peer``. Data frames are referenced until sent: do not mutate them."""
        if peer in self._gone:
            log.debug("[%s] dropped a %s to %s, which was disconnected", self.name, message.kind.name, peer)
            return
        if peer not in self._peers:
            raise KeyError(f"{self.name}: no connection to peer {peer!r}")
        if message.kind is Kind.PUSHPULL and self._outages:
            self._outages.training_started(time.monotonic())
        frames = encode(message)
        outgoing = _Outgoing(peer, frames, frames_nbytes(frames))
        if self.tracer is not None:
            outgoing.tag = (message.kind.name, message.key, message.part, message.round, message.is_reply)
            self.tracer.event("queue", peer, *outgoing.tag, outgoing.nbytes)
        self._commands.put(("send", (outgoing, message.priority)))
        self._wake()

    def send_datagram(self, peer: str, address: tuple[str, int], data: bytes, channel: int,
                      lost: bool = False) -> None:
        """Queue a DGT datagram for ``address`` (the UDP endpoint of ``peer``) on the links to ``peer``, behind
        every message (lower ``channel`` first). ``lost``: emulated loss, it takes the link but never arrives.

        Usage: ``van.send_datagram(global_server_id, ("127.0.0.1", 41235), encode_datagram(d), channel=1)``
        """
        if peer in self._gone:
            return
        if peer not in self._peers:
            raise KeyError(f"{self.name}: no connection to peer {peer!r}")
        outgoing = _Outgoing(peer, [data], len(data), udp=address, lost=lost)
        self._commands.put(("send", (outgoing, -channel)))
        self._wake()

    def receive_datagram(self, peer: str, nbytes: int, deliver: Delivery) -> None:
        """A DGT datagram from ``peer`` arrived on a UDP socket (any thread): count it like a message's bytes.
        Where its messages pass an ingress (the party's access link for the WAN, the LAN ingress), it passes it
        too, behind them, and ``deliver()`` runs on the dispatch thread; elsewhere ``deliver()`` runs now.

        Usage: ``van.receive_datagram(datagram.sender, datagram.nbytes, lambda: handle(datagram))``
        """
        known = self._peers.get(peer)
        self.counters.add(peer if known else "<unknown>", known.link_class if known else LAN, "recv", nbytes)
        if known is not None and (self._access_in if known.link_class == WAN else self._lan_in) is not None:
            self._commands.put(("datagram_in", (known, nbytes, deliver, time.monotonic())))
            self._wake()
            return
        deliver()

    def flush(self, timeout: float) -> bool:
        """Wait until every queued message has been handed to ZeroMQ; False on timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._idle.clear()
            self._commands.put(("flush", None))
            self._wake()
            if self._idle.wait(max(0.0, deadline - time.monotonic())):
                return True
        return False

    def on_stop(self, hook: Callable[[], None]) -> None:
        """Run ``hook`` when the van stops (before the sockets close), e.g. to end a heartbeat thread."""
        self._stop_hooks.append(hook)

    def stop(self, flush_timeout: float = 5.0) -> None:
        """Deliver what is queued (up to ``flush_timeout``), then close the sockets and join the threads."""
        if self._stopping.is_set():
            return
        for hook in self._stop_hooks:
            hook()
        if self._started.is_set() and self._start_error is None:
            self.flush(flush_timeout)
        self._stopping.set()
        self._inbox.put(None)
        self._wake()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout=5)
        os.close(self._wake_read)
        os.close(self._wake_write)
        self._context.term()
        if self.tracer is not None:
            self.tracer.close()

    # -- internals ----------------------------------------------------------------------------------------
    def _wake(self) -> None:
        # A full pipe means a wake-up is pending anyway; a closed one means we are shutting down.
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_write, b"x")

    def _link_spec(self, peer: _Peer) -> LinkSpec:
        if peer.link_class == LAN:
            return self._topology.lan
        return self._topology.wan_between(self.party, peer.party)

    def _open_router(self) -> tuple[zmq.Socket[Any], list[zmq.Socket[Any]]]:
        router = self._context.socket(zmq.ROUTER)
        router.setsockopt(zmq.RCVHWM, 0)
        router.setsockopt(zmq.LINGER, 0)
        router.setsockopt(zmq.MAXMSGSIZE, self._topology.max_message_bytes + (1 << 20))
        guards = self.guard.serve(self._context, router)
        if self._bind_port:
            router.bind(f"tcp://{self._bind_host}:{self._bind_port}")
        else:
            router.bind(f"tcp://{self._bind_host}:*")
        self.address = router.getsockopt_string(zmq.LAST_ENDPOINT)
        return router, guards

    def _connect(self, peer: _Peer, share: int) -> None:
        sock = self._context.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, self.identity.encode())
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.LINGER, 2000)
        self.guard.connect(sock, peer.party)
        sock.connect(peer.address)
        self._sockets[peer.identity] = sock
        if peer.link_key not in self._links:
            spec = self._link_spec(peer)
            self._links[peer.link_key] = ShapedLink(spec, share if peer.link_class == WAN else 1)
        if peer.link_class == WAN and self._access_bps is not None:
            self._access_share = max(self._access_share, share)
            if self._access_out is None or self._access_in is None:
                self._access_out = ShapedLink(LinkSpec(self._access_bps))
                self._access_in = ShapedLink(LinkSpec(self._access_bps))
            for access in (self._access_out, self._access_in):
                access.rate_bps = self._access_bps / self._access_share

    def _io_loop(self) -> None:
        try:
            router, guards = self._open_router()
        except zmq.ZMQError as exc:
            self._start_error = RuntimeError(f"{self.name}: cannot bind tcp://{self._bind_host}:"
                                             f"{self._bind_port or '*'}: {exc}")
            self._started.set()
            return
        self._started.set()
        poller = zmq.Poller()
        poller.register(router, zmq.POLLIN)
        poller.register(self._wake_read, zmq.POLLIN)
        for sock in guards:
            poller.register(sock, zmq.POLLIN)
        wake_at: float | None = None
        try:
            while not self._stopping.is_set():
                timeout_ms = 200.0
                if wake_at is not None:
                    timeout_ms = min(timeout_ms, max(0.0, (wake_at - time.monotonic()) * 1000.0))
                events = dict(poller.poll(int(timeout_ms + 0.999)))
                for sock in guards:
                    if sock in events:
                        self.guard.answer(sock)
                if router in events:
                    self._receive_available(router)
                if self._wake_read in events:
                    try:
                        while os.read(self._wake_read, 4096):
                            pass
                    except BlockingIOError:
                        pass
                wake_at = self._pump()
        finally:
            router.close(linger=0)
            for sock in guards:
                sock.close(linger=0)
            for sock in self._sockets.values():
                sock.close(linger=1000)
            if self._udp_sock is not None:
                self._udp_sock.close()

    def _pump(self) -> float | None:
        """Run queued commands, move messages through the links, send what is due. Returns next wake time."""
        now = time.monotonic()
        flush_requested = False
        while True:
            try:
                command, payload = self._commands.get_nowait()
            except queue.Empty:
                break
            if command == "connect":
                self._connect(*payload)
            elif command == "disconnect":
                sock = self._sockets.pop(payload, None)
                if sock is not None:
                    sock.close(linger=0)
            elif command == "send":
                outgoing, priority = payload
                peer = self._peers[outgoing.peer]
                if outgoing.udp is not None and self._cut_until(peer.link_class, peer.party, now) is not None:
                    self.datagrams.lost_to_outage += 1  # sent into a cut WAN: gone (messages wait instead)
                elif outgoing.udp is not None and self._udp_pace is not None and self._unlimited(peer):
                    self._udp_pace.offer((outgoing, priority), outgoing.nbytes, priority, now)
                else:
                    self._enter(outgoing, priority, now)
            elif command == "datagram_in":
                self._enter_ingress(*payload, background=True)
            elif command == "flush":
                flush_requested = True
        wake_at = self._pump_pace(now)
        wake_at = _earliest(wake_at, self._pump_access(now))
        for (link_class, party), link in self._links.items():
            until = self._cut_until(link_class, party, now)
            if until is not None:  # the WAN to that party is cut: nothing starts before the outage ends
                link.hold_until(until)
            started, link_wake = link.poll(now)
            for deliver_at, outgoing in started:
                deliver_at = max(deliver_at, outgoing.ready_at + link.latency_s)
                heapq.heappush(self._due, (deliver_at, next(self._due_seq), outgoing))
            wake_at = _earliest(wake_at, link_wake)
        now = time.monotonic()
        while self._due and self._due[0][0] <= now:
            _, _, outgoing = heapq.heappop(self._due)
            peer = self._peers[outgoing.peer]
            until = self._cut_until(peer.link_class, peer.party, now)
            if until is not None and outgoing.udp is not None:  # a datagram in flight when the WAN was cut
                self.datagrams.lost_to_outage += 1
                continue
            if until is not None:  # in flight when the WAN was cut: it arrives when the outage ends
                heapq.heappush(self._due, (until, next(self._due_seq), outgoing))
                continue
            self._transmit(outgoing)
        if self._due:
            wake_at = _earliest(wake_at, self._due[0][0])
        if flush_requested:
            access_busy = any(link is not None and len(link) > 0 for link in (self._access_out, self._udp_pace))
            if not self._due and not access_busy and all(len(link) == 0 for link in self._links.values()):
                self._idle.set()
            else:
                self._commands.put(("flush", None))  # look again at the next wake-up
        return wake_at

    def _enter(self, outgoing: _Outgoing, priority: int, now: float) -> None:
        """Queue ``outgoing`` on its way out: the party's access link for the WAN (if any), else its peer's link."""
        peer = self._peers[outgoing.peer]
        background = outgoing.udp is not None
        if peer.link_class == WAN and self._access_out is not None:
            self._access_out.offer((outgoing, priority), outgoing.nbytes, priority, now, background)
        else:
            self._links[peer.link_key].offer(outgoing, outgoing.nbytes, priority, now, background)

    def _unlimited(self, peer: _Peer) -> bool:
        """Whether nothing on the way to ``peer`` sets a rate (then DGT datagrams are paced on their own)."""
        link = self._links.get(peer.link_key)
        access = self._access_out if peer.link_class == WAN else None
        return (link is None or link.rate_bps is None) and (access is None or access.rate_bps is None)

    def _pump_pace(self, now: float) -> float | None:
        """Datagrams to unlimited links leave the pacer at DGT's rate into their links; returns the next wake-up."""
        if self._udp_pace is None:
            return None
        started, wake_at = self._udp_pace.poll(now)
        rate = self._udp_pace.rate_bps or 0.0
        for end, (outgoing, priority) in started:
            self._enter(outgoing, priority, end - (outgoing.nbytes * 8.0 / rate if rate else 0.0))
        return wake_at

    def _pump_access(self, now: float) -> float | None:
        """Move messages through the party's access link and the node's LAN ingress (where configured); returns
        when to look again.

        Cut-through: a send enters its destination's pipe when it *starts* on the access link and is delivered no
        earlier than its last bit leaves it, so the slower of the two sets the pace (no double serialization).
        A receipt is handed to the node when its ingress (access link or LAN) has carried it after the ones
        before it.
        """
        wake_at = None
        if self._access_out is not None:
            started, wake_at = self._access_out.poll(now)
            rate = self._access_out.rate_bps or 0.0
            for end, (outgoing, priority) in started:
                outgoing.ready_at = end
                start = end - (outgoing.nbytes * 8.0 / rate if rate else 0.0)
                self._links[self._peers[outgoing.peer].link_key].offer(outgoing, outgoing.nbytes, priority, start,
                                                                       background=outgoing.udp is not None)
        for ingress in (self._access_in, self._lan_in):
            if ingress is None:
                continue
            arrived, in_wake = ingress.poll(now)
            for deliver_at, message in arrived:
                heapq.heappush(self._inbound, (deliver_at, next(self._due_seq), message))
            wake_at = _earliest(wake_at, in_wake)
        while self._inbound and self._inbound[0][0] <= now:
            self._inbox.put(heapq.heappop(self._inbound)[2])
        return _earliest(wake_at, self._inbound[0][0] if self._inbound else None)

    def _cut_until(self, link_class: str, party: str, now: float) -> float | None:
        """When the outage cutting the WAN to ``party`` ends, or None if that link is up (or not WAN)."""
        return self._outages.blocked_until(party, now) if link_class == WAN and self._outages else None

    def _transmit_datagram(self, peer: _Peer, outgoing: _Outgoing) -> None:
        assert outgoing.udp is not None
        if self._udp_sock is None:
            self._udp_sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            self._udp_sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        if not outgoing.lost:
            try:
                self._udp_sock.sendto(outgoing.frames[0], outgoing.udp)
            except OSError as exc:
                self.datagrams.errors += 1
                log.warning("[%s] UDP send to %s failed: %s", self.name, outgoing.udp, exc)
                return
        else:
            self.datagrams.lost += 1
        self.datagrams.sent += 1
        self.datagrams.sent_bytes += outgoing.nbytes
        self.counters.add(peer.identity, peer.link_class, "sent", outgoing.nbytes)

    def _transmit(self, outgoing: _Outgoing) -> None:
        peer = self._peers[outgoing.peer]
        if outgoing.udp is not None:
            self._transmit_datagram(peer, outgoing)
            return
        sock = self._sockets.get(outgoing.peer)
        if sock is None:  # disconnected while the message waited in its link
            return
        try:
            sock.send_multipart(outgoing.frames, copy=False)
        except zmq.ZMQError as exc:
            log.error("[%s] cannot send to %s at %s: %s", self.name, peer.identity, peer.address, exc)
            return
        self.counters.add(peer.identity, peer.link_class, "sent", outgoing.nbytes)
        if self.tracer is not None and outgoing.tag is not None:
            self.tracer.event("out", peer.identity, *outgoing.tag, outgoing.nbytes)

    def _receive_available(self, router: zmq.Socket[Any]) -> None:
        for _ in range(256):
            try:
                frames = router.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            sender = bytes(frames[0].buffer).decode("utf-8", errors="replace")
            body = frames[1:]
            peer = self._peers.get(sender)
            nbytes = sum(len(f.buffer) for f in body)
            self.counters.add(sender if peer else "<unknown>", peer.link_class if peer else LAN, "recv", nbytes)
            try:
                message = decode(body, self._topology.max_message_bytes)
            except WireError as exc:
                self.malformed += 1
                if self.malformed <= 20 or self.malformed % 1000 == 0:  # a flood of junk must not flood the log
                    log.warning("[%s] dropped a malformed message from %r (%d so far): %s", self.name, sender,
                                self.malformed, exc)
                continue
            except Exception:  # decode has a bug: log it, keep receiving
                self.malformed += 1
                log.exception("[%s] could not decode a message from %r", self.name, sender)
                continue
            message.sender = sender.encode()
            if self.tracer is not None:
                self.tracer.event("in", sender, message.kind.name, message.key, message.part, message.round,
                                  message.is_reply, nbytes)
            if message.kind is Kind.PUSHPULL and self._outages:
                self._outages.training_started(time.monotonic())
            if message.kind is Kind.HEARTBEAT and self.heartbeat_hook is not None and self.heartbeat_hook(message):
                continue
            if peer is not None and self._enter_ingress(peer, nbytes, message, time.monotonic()):
                continue
            self._inbox.put(message)

    def _enter_ingress(self, peer: _Peer, nbytes: int, item: Message | Delivery, arrived: float,
                       background: bool = False) -> bool:
        """Queue a receipt at the node's ingress for ``peer``'s link class, if there is one (False: there is none).
        In-cast: it started arriving when the sender's link started sending it; the ingress carries one receipt
        at a time (see _pump_access), datagrams (``background``) behind messages."""
        ingress = self._access_in if peer.link_class == WAN else self._lan_in
        if ingress is None:
            return False
        link = self._link_spec(peer)
        wire_s = nbytes * 8.0 / link.bandwidth_bps if link.bandwidth_bps else 0.0
        priority = item.priority if isinstance(item, Message) else 0
        ingress.offer(item, nbytes, priority, arrived - wire_s, background)
        return True

    @property
    def running(self) -> bool:
        """Whether this van still moves messages (started, not stopped, both threads alive)."""
        return (self._started.is_set() and self._start_error is None and not self._stopping.is_set()
                and bool(self._threads) and all(t.is_alive() for t in self._threads))

    def _dispatch_loop(self) -> None:
        io = self._threads[0]
        while True:
            try:  # bounded: an I/O thread that died would leave this thread waiting for messages forever
                message = self._inbox.get(timeout=DISPATCH_POLL_S)
            except queue.Empty:
                if self._stopping.is_set():
                    return
                if not io.is_alive():
                    log.error("[%s] stopped waiting for messages to handle: the I/O thread has ended", self.name)
                    return
                continue
            if message is None:
                return
            if not isinstance(message, Message):  # a DGT datagram that passed the ingress
                try:
                    message()
                except Exception:
                    log.exception("[%s] DGT datagram handler failed", self.name)
                continue
            try:
                self._handler(message)
                if self.tracer is not None:
                    self.tracer.event("handled", message.sender.decode(), message.kind.name, message.key,
                                      message.part, message.round, message.is_reply, 0)
            except Exception as exc:  # a bad message must never kill the node
                log.exception("[%s] handler failed on %s from %r", self.name, message.kind.name,
                              message.sender)
                sender = message.sender.decode()
                if not message.is_reply and message.kind is not Kind.ERROR and sender in self._peers:
                    self.send(sender, message.error(f"{self.name}: {type(exc).__name__}: {exc}"))
