"""The van: ZeroMQ sockets, the I/O thread and the dispatch thread of one node.

Each process has one ``Van``: one ROUTER socket receives, one DEALER per peer sends (its identity is this
node's id). One I/O thread owns all sockets; one dispatch thread runs the node's handler, so a slow handler
never stops bytes from moving. ``send`` may be called from any thread. UDP datagrams (``send_datagram``)
take the same emulated links as the messages to their peer, strictly behind them, and count in the same
byte counters. The links are ``geomx.transport.links.LinkModel``, the counters ``geomx.transport.counters``.

Usage::

    van = Van("dc1/worker/ab12", party="dc1", topology=topology, handler=on_message)
    address = van.start()                     # "tcp://127.0.0.1:41234"
    van.add_peer("dc1/server/cd34", "tcp://127.0.0.1:41235", party="dc1")
    van.send("dc1/server/cd34", Message(Kind.PULL, key=0))
    van.stop()
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import zmq

from ..config import Topology
from ..protocol.wire import Kind, Message, WireError, decode, encode, frames_nbytes
from .counters import LAN, WAN, ByteCounters, DatagramCounts, codec_saving
from .dispatch import DISPATCH_POLL_S, dispatch
from .emulator import OutageSchedule
from .frames import receive_frames, send_frames
from .links import Delivery, LinkModel, Outgoing, Peer, earliest
from .reach import BindError, Watches
from .security import Guard
from .shutdown import ended_by_shutdown
from .trace import Tracer
from .udp import UdpSender

__all__ = ["DISPATCH_POLL_S", "LAN", "WAN", "ByteCounters", "DatagramCounts", "Delivery", "Handler", "Hook", "Van"]

log = logging.getLogger("geomx.transport.van")
_PUSHES = (Kind.PUSHPULL, Kind.BUNDLE)  # what starts training, for the WAN outages' clock

Handler = Callable[[Message], None]
Hook = Callable[[Message], bool]  # True: the message was consumed


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
        self._gone: set[str] = set()  # peers disconnected for good (see disconnect)
        self._sockets: dict[str, zmq.Socket[Any]] = {}
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
        self._links = LinkModel(topology, party, self.datagrams, self._inbox.put)
        self._peers: dict[str, Peer] = self._links.peers
        self._udp = UdpSender(self.datagrams, self.name)  # DGT datagrams (the I/O thread only)
        self.address = ""
        self.malformed = 0
        # refuses peers without the shared secret / CURVE key during the handshake (see geomx.transport.security)
        self.guard = Guard(topology.security, party, name=self.name, peers=[p.name for p in topology.parties])
        self.watches = Watches(self.guard.mechanism)  # the connections add_peer watches: watches.reaches[peer]
        self._poller: zmq.Poller | None = None
        # sees HEARTBEAT messages first, on the I/O thread, so a slow handler never delays them
        self.heartbeat_hook: Hook | None = None
        self._stop_hooks: list[Callable[[], None]] = []
        # GEOMX_TRACE=1 (see geomx.transport.trace): the node sets this; None costs one test per message event
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

    def add_peer(self, identity: str, address: str, party: str, share: int = 1, watch: bool = False) -> None:
        """Connect to a peer. ``share``: how many processes of this party share the WAN pipe to its party. ``watch``:
        follow the connection's events (``watches``): does anything listen there, did the peer take our credentials."""
        if identity in self._peers:
            return
        if watch:
            self.watches.expect(identity, address)
        # two connections to one address carry this node's one identity, and the ROUTER there keeps one of them:
        # what is sent on the other is lost without an error on either side
        twin = next((p.identity for p in self._peers.values() if p.address == address and p.identity not in self._gone),
                    None)
        if twin is not None:
            log.warning("[%s] %s and %s are both at %s: the node there keeps one of this node's two connections, and "
                        "messages on the other are lost", self.name, twin, identity, address)
        peer = self._links.new_peer(identity, address, party)
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
        return self._links.outages

    @property
    def topology(self) -> Topology:
        return self._topology

    def knows(self, identity: str) -> bool:
        return identity in self._peers

    def peer_party(self, identity: str) -> str | None:
        return peer.party if (peer := self._peers.get(identity)) else None

    def send(self, peer: str, message: Message) -> None:
        """Queue ``message`` to ``peer``. Data frames are referenced until sent: do not mutate them."""
        if peer in self._gone:
            log.debug("[%s] dropped a %s to %s, which was disconnected", self.name, message.kind.name, peer)
            return
        if peer not in self._peers:
            raise KeyError(f"{self.name}: no connection to peer {peer!r}")
        if message.kind in _PUSHES and self._links.outages:
            self._links.outages.training_started(time.monotonic())
        frames = encode(message)
        outgoing = Outgoing(peer, frames, frames_nbytes(frames))
        if (saving := codec_saving(message)) is not None:  # what the codec kept off the link (the status page's)
            self.counters.add_saved(self._peers[peer].link_class, saving)
        if self.tracer is not None:
            outgoing.tag = (message.kind.name, message.key, message.slice, message.round, message.is_reply)
            self.tracer.event("queue", peer, *outgoing.tag, outgoing.nbytes)
        self._commands.put(("send", (outgoing, message.priority)))
        self._wake()

    def send_datagram(self, peer: str, address: tuple[str, int], data: bytes, channel: int,
                      lost: bool = False) -> None:
        """Queue a DGT datagram for ``address`` (the UDP endpoint of ``peer``) on the links to ``peer``, behind
        every message (lower ``channel`` first). ``lost``: emulated loss, it takes the link but never arrives.

        Usage: ``van.send_datagram(global_server_id, ("127.0.0.1", 41235), encode_datagram(d), channel=1)``"""
        if peer in self._gone:
            return
        if peer not in self._peers:
            raise KeyError(f"{self.name}: no connection to peer {peer!r}")
        outgoing = Outgoing(peer, [data], len(data), udp=address, lost=lost)
        self._commands.put(("send", (outgoing, -channel)))
        self._wake()

    def receive_datagram(self, peer: str, nbytes: int, deliver: Delivery) -> None:
        """A DGT datagram from ``peer`` arrived on a UDP socket (any thread): count it like a message's bytes.
        Where its messages pass an ingress (the party's access link for the WAN, the LAN ingress), it passes it
        too, behind them, and ``deliver()`` runs on the dispatch thread; elsewhere ``deliver()`` runs now.

        Usage: ``van.receive_datagram(datagram.sender, datagram.nbytes, lambda: handle(datagram))``"""
        known = self._peers.get(peer)
        self.counters.add(peer if known else "<unknown>", known.link_class if known else LAN, "recv", nbytes)
        if known is not None and self._links.has_ingress(known):
            self._commands.put(("datagram_in", (known, nbytes, deliver, time.monotonic())))
            self._wake()
            return
        deliver()

    def flush(self, timeout: float) -> bool:
        """Wait until every queued message has been handed to ZeroMQ; False on timeout or once the I/O thread ended."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.running:
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
        self.flush(flush_timeout)  # (at once where the van never ran: ``running``)
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

    def _open_router(self) -> tuple[zmq.Socket[Any], list[zmq.Socket[Any]]]:
        router = self._context.socket(zmq.ROUTER)
        router.setsockopt(zmq.RCVHWM, 0)
        router.setsockopt(zmq.LINGER, 0)
        router.setsockopt(zmq.MAXMSGSIZE, self._topology.max_message_bytes + (1 << 20))
        guards = self.guard.serve(self._context, router)
        router.bind(f"tcp://{self._bind_host}:{self._bind_port or '*'}")
        self.address = router.getsockopt_string(zmq.LAST_ENDPOINT)
        return router, guards

    def _connect(self, peer: Peer, share: int) -> None:
        sock = self._context.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, self.identity.encode())
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.LINGER, 2000)
        self.guard.connect(sock, peer.party)
        self.watches.attach(peer.identity, sock, self._poller)
        sock.connect(peer.address)
        self._sockets[peer.identity] = sock
        self._links.add_peer(peer, share)

    def _io_loop(self) -> None:
        try:
            router, guards = self._open_router()
        except zmq.ZMQError as exc:
            self._start_error = BindError.of(self.name, f"{self._bind_host}:{self._bind_port or '*'}", exc)
            return
        finally:
            self._started.set()  # (after _start_error: start() reads it once this is set)
        poller = self._poller = zmq.Poller()
        for sock in (router, self._wake_read, *guards):
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
                self.watches.drain(events)
                if router in events:
                    self._receive_available(router)
                if self._wake_read in events:
                    with contextlib.suppress(BlockingIOError):
                        while os.read(self._wake_read, 4096):
                            pass
                wake_at = self._pump()
        except Exception as exc:  # ZeroMQ going away under a van being shut down ends it quietly; a fault surfaces
            if not ended_by_shutdown(exc, self._stopping.is_set()):
                raise
            log.debug("[%s] the I/O thread ends at shutdown: %s", self.name, exc)
            self._inbox.put(None)  # the dispatch thread ends too, and a flush waiting returns: nothing more moves
            self._idle.set()
        finally:
            for sock in (router, *guards):
                sock.close(linger=0)
            self.watches.close()
            for sock in self._sockets.values():
                sock.close(linger=1000)
            self._udp.close()

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
                self._links.offer(outgoing, priority, now)
            elif command == "datagram_in":
                peer, nbytes, deliver, arrived = payload
                self._links.enter_ingress(peer, nbytes, deliver, arrived, background=True)
            elif command == "flush":
                flush_requested = True
        wake_at = self._links.advance(now)
        for outgoing in self._links.due(time.monotonic()):
            self._transmit(outgoing)
        wake_at = earliest(wake_at, self._links.next_due())
        if flush_requested:
            if self._links.idle():
                self._idle.set()
            else:
                self._commands.put(("flush", None))  # look again at the next wake-up
        return wake_at

    def _transmit(self, outgoing: Outgoing) -> None:
        peer = self._peers[outgoing.peer]
        if outgoing.udp is not None:
            if self._udp.send(outgoing.frames[0], outgoing.udp, outgoing.lost):
                self.counters.add(peer.identity, peer.link_class, "sent", outgoing.nbytes)
            return
        sock = self._sockets.get(outgoing.peer)
        if sock is None:  # disconnected while the message waited in its link
            return
        # the "out" event's time (tracing only): once the call returns, the peer may have stamped "in"
        handed = time.time() if self.tracer is not None else None
        try:
            send_frames(sock, outgoing.frames)
        except zmq.ZMQError as exc:
            if exc.errno == zmq.ETERM:  # the context is terminated: nothing more can be sent (see _io_loop)
                raise
            log.error("[%s] cannot send to %s at %s: %s", self.name, peer.identity, peer.address, exc)
            return
        self.counters.add(peer.identity, peer.link_class, "sent", outgoing.nbytes)
        if self.tracer is not None and outgoing.tag is not None:
            self.tracer.event("out", peer.identity, *outgoing.tag, outgoing.nbytes, at=handed)

    def _receive_available(self, router: zmq.Socket[Any]) -> None:
        for _ in range(256):
            try:
                frames = receive_frames(router)
            except zmq.Again:
                return
            sender = frames[0].bytes.decode("utf-8", errors="replace")
            body = frames[1:]
            peer = self._peers.get(sender)
            nbytes = sum(len(f) for f in body)
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
                self.tracer.message("in", sender, message, nbytes)
            if message.kind in _PUSHES and self._links.outages:
                self._links.outages.training_started(time.monotonic())
            if message.kind is Kind.HEARTBEAT and self.heartbeat_hook is not None and self.heartbeat_hook(message):
                continue
            if peer is not None and self._links.enter_ingress(peer, nbytes, message, time.monotonic()):
                continue
            self._inbox.put(message)

    @property
    def running(self) -> bool:
        """Whether this van still moves messages (started, not stopped, both threads alive)."""
        return (self._started.is_set() and self._start_error is None and not self._stopping.is_set()
                and bool(self._threads) and all(t.is_alive() for t in self._threads))

    def _dispatch_loop(self) -> None:
        handler = self._handler if self.tracer is None else self.tracer.handled(self._handler)
        dispatch(self.name, self._inbox, handler, self._threads[0], self._stopping, self.send, self._peers)
