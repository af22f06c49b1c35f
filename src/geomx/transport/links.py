"""The van's link model: which emulated links a message crosses on its way out and in, at what pace, and when
it is due (the party's access link, the per-destination pipes, the LAN ingress, DGT's pacer, WAN outages).

It moves items between queues and answers "what is due now, and when to look again"; it owns no socket and
no thread (the van's I/O thread drives it), so it runs the same under a test's clock.

Usage::

    links = LinkModel(topology, party="dc1", datagrams=DatagramCounts(), deliver=inbox.put)
    links.add_peer(peer, share=2)
    links.offer(Outgoing(peer.identity, frames, nbytes), priority=0, now=time.monotonic())
    wake_at = links.advance(time.monotonic())
    for outgoing in links.due(time.monotonic()): transmit(outgoing)
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..config import LinkSpec, Topology
from ..protocol.wire import Message
from .counters import LAN, WAN, DatagramCounts
from .emulator import OutageSchedule, ShapedLink

Delivery = Callable[[], None]  # a received DGT datagram's handling, run once it passed the node's ingress


def earliest(*times: float | None) -> float | None:
    """The earliest of the given wake-up times that are set (None if none is)."""
    return min((t for t in times if t is not None), default=None)


@dataclass
class Peer:
    identity: str
    address: str
    party: str
    link_class: str
    link_key: tuple[str, str]


@dataclass
class Outgoing:
    peer: str
    frames: list[Any]
    nbytes: int
    ready_at: float = 0.0  # when its last bit left the party's access link (delivery is not earlier + latency)
    udp: tuple[str, int] | None = None  # a DGT datagram (frames == [bytes]) to this UDP address
    lost: bool = False  # the datagram is lost on the way (emulated loss): it takes the link, then vanishes
    tag: tuple[str, int, int, int, bool] | None = None  # (kind, key, slice, round, reply) when tracing


class LinkModel:
    """The emulated links of one node (I/O thread only). See the module docstring."""

    def __init__(self, topology: Topology, party: str, datagrams: DatagramCounts,
                 deliver: Callable[[Message | Delivery], None]) -> None:
        self._topology = topology
        self._party = party
        self._datagrams = datagrams
        self._deliver = deliver
        self.peers: dict[str, Peer] = {}
        self._links: dict[tuple[str, str], ShapedLink[Outgoing]] = {}
        self.outages = OutageSchedule(topology.outages, party, topology.job_start)
        # The party's own connection to the WAN (topology ``access``), shared by all WAN traffic per direction:
        # sends pass it on their way into their destination's pipe, receipts before they are handled.
        # Made here, not with the first WAN peer: a receipt the I/O thread reads before it has run that peer's connect
        # must queue at the access link too (one that passed it arrived at once in a loaded run of the in-cast test).
        self._access_bps = topology.access_bps(party)
        self._access_share = 1
        access = None if self._access_bps is None else LinkSpec(self._access_bps)
        self._access_out: ShapedLink[tuple[Outgoing, int]] | None = None if access is None else ShapedLink(access)
        self._access_in: ShapedLink[Message | Delivery] | None = None if access is None else ShapedLink(access)
        # The node's inbound LAN side (``links.lan.ingress``): LAN receipts queue there like WAN ones at the access
        # link, so workers sending to their local server at once share its rate.
        lan = topology.lan
        self._lan_in: ShapedLink[Message | Delivery] | None = (
            ShapedLink(LinkSpec(lan.bandwidth_bps)) if lan.ingress and lan.bandwidth_bps else None)
        self._inbound: list[tuple[float, int, Message | Delivery]] = []
        self._due: list[tuple[float, int, Outgoing]] = []
        # messages to a pipe that shapes nothing (no rate, no latency, no access link or outage on the way: an
        # unemulated LAN or WAN) skip the pipe's queue and leave at the next ``due``, highest priority first
        self._instant_keys: set[tuple[str, str]] = set()
        self._instant: list[tuple[int, int, Outgoing]] = []
        self._due_seq = itertools.count()
        # Datagrams to a peer whose links set no rate are paced here (even loopback drops unpaced bursts).
        pace = topology.dgt.rate_bps if topology.dgt is not None else None
        self._udp_pace: ShapedLink[tuple[Outgoing, int]] | None = ShapedLink(LinkSpec(pace)) if pace else None

    def new_peer(self, identity: str, address: str, party: str) -> Peer:
        """A peer of this node, with the link class (LAN or WAN) and pipe its party gives it."""
        link_class = LAN if party == self._party else WAN
        peer = Peer(identity, address, party, link_class, (link_class, party if link_class == WAN else self._party))
        self.peers[identity] = peer
        return peer

    def add_peer(self, peer: Peer, share: int) -> None:
        """Open ``peer``'s pipe (if its party has none yet); over the WAN, the access link's share of the party's
        processes that use it."""
        if peer.link_key not in self._links:
            link = self._links[peer.link_key] = ShapedLink(self.link_spec(peer), share if peer.link_class == WAN else 1)
            shaped_on_the_way = peer.link_class == WAN and (self._access_out is not None or bool(self.outages))
            if link.rate_bps is None and link.latency_s == 0 and not shaped_on_the_way:
                self._instant_keys.add(peer.link_key)
        if peer.link_class == WAN and self._access_bps is not None:
            self._access_share = max(self._access_share, share)
            for access in (self._access_out, self._access_in):
                assert access is not None  # made with the access rate, in __init__
                access.rate_bps = self._access_bps / self._access_share

    def link_spec(self, peer: Peer) -> LinkSpec:
        if peer.link_class == LAN:
            return self._topology.lan
        return self._topology.wan_between(self._party, peer.party)

    def offer(self, outgoing: Outgoing, priority: int, now: float) -> None:
        """A send enters the model: a datagram into a cut WAN is lost, one to an unlimited link is paced."""
        peer = self.peers[outgoing.peer]
        if outgoing.udp is not None and self.cut_until(peer.link_class, peer.party, now) is not None:
            self._datagrams.lost_to_outage += 1  # sent into a cut WAN: gone (messages wait instead)
        elif outgoing.udp is not None and self._udp_pace is not None and self._unlimited(peer):
            self._udp_pace.offer((outgoing, priority), outgoing.nbytes, priority, now)
        else:
            self._enter(outgoing, priority, now)

    def advance(self, now: float) -> float | None:
        """Move sends through the pacer, the access link and the pipes, receipts through the ingresses (handing
        the node those that passed); returns when to look again."""
        wake_at = earliest(self._pump_pace(now), self._pump_access(now))
        for (link_class, party), link in self._links.items():
            if not len(link):  # nothing to start (a cut is applied when something is offered during it)
                continue
            until = self.cut_until(link_class, party, now)
            if until is not None:  # the WAN to that party is cut: nothing starts before the outage ends
                link.hold_until(until)
            started, link_wake = link.poll(now)
            for deliver_at, outgoing in started:
                deliver_at = max(deliver_at, outgoing.ready_at + link.latency_s)
                heapq.heappush(self._due, (deliver_at, next(self._due_seq), outgoing))
            wake_at = earliest(wake_at, link_wake)
        return wake_at

    def due(self, now: float) -> list[Outgoing]:
        """The sends whose delivery time has come (a WAN cut meanwhile holds a message, loses a datagram)."""
        ready = [heapq.heappop(self._instant)[2] for _ in range(len(self._instant))]
        while self._due and self._due[0][0] <= now:
            _, _, outgoing = heapq.heappop(self._due)
            peer = self.peers[outgoing.peer]
            until = self.cut_until(peer.link_class, peer.party, now)
            if until is not None and outgoing.udp is not None:  # a datagram in flight when the WAN was cut
                self._datagrams.lost_to_outage += 1
                continue
            if until is not None:  # in flight when the WAN was cut: it arrives when the outage ends
                heapq.heappush(self._due, (until, next(self._due_seq), outgoing))
                continue
            ready.append(outgoing)
        return ready

    def next_due(self) -> float | None:
        if self._instant:
            return 0.0  # due already
        return self._due[0][0] if self._due else None

    def idle(self) -> bool:
        """Whether no send waits anywhere in the model (a flush is complete)."""
        access_busy = any(link is not None and len(link) > 0 for link in (self._access_out, self._udp_pace))
        return (not self._due and not self._instant and not access_busy
                and all(len(link) == 0 for link in self._links.values()))

    def has_ingress(self, peer: Peer) -> bool:
        """Whether receipts from ``peer`` pass an ingress (the access link for the WAN, the LAN ingress)."""
        return (self._access_in if peer.link_class == WAN else self._lan_in) is not None

    def enter_ingress(self, peer: Peer, nbytes: int, item: Message | Delivery, arrived: float,
                      background: bool = False) -> bool:
        """Queue a receipt at the node's ingress for ``peer``'s link class, if there is one (False: there is none).
        In-cast: it started arriving when the sender's link started sending it; the ingress carries one receipt
        at a time (see _pump_access), datagrams (``background``) behind messages."""
        ingress = self._access_in if peer.link_class == WAN else self._lan_in
        if ingress is None:
            return False
        link = self.link_spec(peer)
        wire_s = nbytes * 8.0 / link.bandwidth_bps if link.bandwidth_bps else 0.0
        priority = item.priority if isinstance(item, Message) else 0
        ingress.offer(item, nbytes, priority, arrived - wire_s, background)
        return True

    def cut_until(self, link_class: str, party: str, now: float) -> float | None:
        """When the outage cutting the WAN to ``party`` ends, or None if that link is up (or not WAN)."""
        return self.outages.blocked_until(party, now) if link_class == WAN and self.outages else None

    # -- internals ----------------------------------------------------------------------------------------
    def _enter(self, outgoing: Outgoing, priority: int, now: float) -> None:
        """Queue ``outgoing`` on its way out: the party's access link for the WAN (if any), else its peer's link."""
        peer = self.peers[outgoing.peer]
        background = outgoing.udp is not None
        if peer.link_class == WAN and self._access_out is not None:
            self._access_out.offer((outgoing, priority), outgoing.nbytes, priority, now, background)
        elif not background and peer.link_key in self._instant_keys:
            heapq.heappush(self._instant, (-priority, next(self._due_seq), outgoing))
        else:
            self._links[peer.link_key].offer(outgoing, outgoing.nbytes, priority, now, background)

    def _unlimited(self, peer: Peer) -> bool:
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
                self._links[self.peers[outgoing.peer].link_key].offer(outgoing, outgoing.nbytes, priority, start,
                                                                      background=outgoing.udp is not None)
        for ingress in (self._access_in, self._lan_in):
            if ingress is None:
                continue
            arrived, in_wake = ingress.poll(now)
            for deliver_at, message in arrived:
                heapq.heappush(self._inbound, (deliver_at, next(self._due_seq), message))
            wake_at = earliest(wake_at, in_wake)
        while self._inbound and self._inbound[0][0] <= now:
            self._deliver(heapq.heappop(self._inbound)[2])
        return earliest(wake_at, self._inbound[0][0] if self._inbound else None)
