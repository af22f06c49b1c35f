"""Clients that die, leave or come back: what a server does when heartbeats declare a client dead, when a
client shuts down, and when the global scheduler admits a restarted party in place of a dead one.

Whether a tier goes on without a client is the plug-ins' call (``may_drop``): every tier of an elastic job, and
a global tier whose sync policy lets clients leave on their own; the aggregation may overrule. Elsewhere a dead
client stops the server, naming it, and shutdown is a round that every client joins.

Usage (the server wires the heartbeats and the request kinds to it)::

    departures = Departures(server)
    pulse.on_dead(departures.member_dead)
    handlers[Kind.SHUTDOWN] = departures.on_shutdown
"""

from __future__ import annotations

import logging
from concurrent.futures import Future

from ..cluster.membership import GLOBAL_SCHEDULER_ID, Member
from ..config import Role
from ..core.clients import collective_client
from ..protocol.bodies import ConfigureBody, MembersNotice, decode_body, encode_body
from ..protocol.wire import Kind, Message
from .host import PartHost

log = logging.getLogger("geomx.server")


class Departures:
    """Dead, departing and rejoining clients of one server (see the module docstring)."""

    def __init__(self, host: PartHost) -> None:
        self.host = host

    def member_dead(self, member: str, why: str) -> None:
        """Heartbeats say ``member`` is dead. Where the tier may go on without it (``may_drop``) the client is
        dropped from the rounds and the others go on; elsewhere the rounds need it: stop, naming it."""
        host = self.host
        with host.lock:
            client = host.clients.client_of(member)  # a collective party's rank: its whole party
            name = host.display(member) if client == member else f"{host.display(member)} of {client}"
            if client in host.clients.remaining():
                if self.may_drop():
                    self.drop(member, name, why)
                    return
                tier = host.table.policy.name if host.is_global else "the local tier"
                host.stop_fatally(f"{name} is dead ({why}); {tier} cannot go on without it")
            elif member in host.upstream:
                host.stop_fatally(f"{name} is dead ({why}); this party cannot train without it")

    def self_dead(self, text: str) -> None:
        """Our scheduler declared this server dead (cut off or frozen too long): its peers have moved on."""
        with self.host.lock:
            self.host.stop_fatally(text)

    def may_drop(self) -> bool:
        """Whether a dead client is dropped instead of stopping: in every tier of an elastic job, and in a global
        tier whose policy lets clients leave on their own; the aggregation may overrule."""
        host = self.host
        policy = host.table.policy
        usual = host.config.topology.elastic or (host.is_global and (policy.clients_leave_independently
                                                                     or policy.drops_dead_clients))
        return host.aggregation.may_drop(usual)

    def drop(self, member: str, name: str, why: str) -> None:
        """Go on without ``member`` (under the lock): open rounds that only waited for it complete now."""
        host = self.host
        client = host.clients.client_of(member)
        remaining = host.clients.drop(client, why)
        log.warning("[%s] dropped %s from the rounds (%s); %d of %d clients left", host.name, name, why,
                    len(remaining), len(host.clients))
        if not remaining:
            self.last_gone()
            return
        host.route.forget(client)
        host.table.complete_ready()
        host.van.disconnect(member)  # it is gone for good (a restarted party rejoins with a new identity)

    def on_shutdown(self, message: Message) -> None:
        """A client leaves. In a global tier that can go on without a client (``may_drop``) each client leaves on
        its own: a fast party exits while a slow (or rejoined) one still trains, and later rounds no longer wait
        for the one that left. Elsewhere, and under a policy that only drops dead clients (SSP: a finished party's
        pushes still queue behind open rounds), shutdown is a round that every client joins."""
        host = self.host
        if not (host.is_global and self.may_drop()) or host.table.policy.drops_dead_clients:
            host.table.contribute(message)
            return
        sender = message.sender.decode()
        client = host.clients.client_of(sender)
        all_gone = host.clients.leave(client)
        host.van.send(sender, message.reply())
        log.info("[%s] %s left (%d of %d clients gone)", host.name, host.display(client),
                 len(host.clients.departed), len(host.clients))
        if all_gone:
            self.last_gone()
            return
        host.table.complete_ready()

    def last_gone(self) -> None:
        """Every client has left or was dropped. Under a round rule (decoupled rounds), a round that holds only
        late deltas folded in (answered already) closes first: they move the model, and nobody waits for it."""
        host = self.host
        if host.table.rule is not None:
            host.table.complete_ready()
        host.all_done()

    def on_members(self, message: Message) -> None:
        """The global scheduler admits a restarted party's local server in place of its dead one: take it as a
        client. Rounds already open do not wait for it; it gets the current model from INIT (a late joiner's
        answer) and the master's WAN compression setting now."""
        host = self.host
        sender = message.sender.decode()
        if sender != GLOBAL_SCHEDULER_ID or not host.is_global:
            host.refuse(message, "only the global scheduler announces members, and only to global servers")
            return
        try:
            notice = decode_body(MembersNotice, message.body)
            member, old = Member.from_json(notice.member), notice.replaces
        except (KeyError, TypeError, ValueError) as exc:  # BodyError is a ValueError
            host.refuse(message, f"malformed MEMBERS notice: {exc}")
            return
        rank = member.role is Role.WORKER and old in host.clients.groups  # a collective party's rank
        if not rank and (old not in host.clients or member.role is not Role.LOCAL_SERVER):
            host.refuse(message, f"{member.name} replaces {old!r}, which is neither a local server nor a collective "
                                 "party's rank of this job")
            return
        refusal = self.rejoin_refusal()
        if refusal is not None:
            host.refuse(message, refusal)
            return
        if host.clients.client_of(old) not in host.clients.departed:  # its death reached the scheduler first
            self.drop(old, host.display(old), f"replaced by a restarted {member.name}")
        host.van.add_peer(member.id, member.address, member.party)
        host.requests.names[member.id] = member.name
        client, new = host.clients.regroup(member.id, old) if rank else (member.id, True)
        if new:  # the party's first rank back: its client joins (its other ranks speak for the same one)
            # named as the party's first client was (reports count a party by name, across its restarts)
            host.requests.names[client] = collective_client(member.party) if rank else client
            host.table.exempt_open(client)
            # an algorithm may hold a rejoiner's rounds until the others end their current cycle; else it waits only
            # for the end of a synchronous round of pushes under way (geomx.core.joiners)
            cycle = any(extension.holds_rejoiners() for extension in host.extensions)
            host.clients.add(client, hold=cycle)
            if not cycle:
                host.table.hold_until_round_ends(client)
        if member.party == host.config.topology.central and not rank:
            host.configurers.add(member.id)
        log.warning("[%s] %s rejoined (replacing the one dropped); %d of %d clients present", host.name,
                    member.name, len(host.clients.remaining()), len(host.clients))
        if not rank:  # a collective rank takes the job's codec from the wrapper's plan, as at a first start
            self._send_compression(member)
        host.van.send(sender, message.reply())

    def rejoin_refusal(self) -> str | None:
        """Why this global server cannot take a party back (None: it can)."""
        host = self.host
        if not self.may_drop():
            return (f"{host.table.policy.name} cannot take a party back (it needs every party in every round); "
                    "an elastic job, or a sync policy or aggregation that goes on without a party, can")
        shards = host.config.topology.num_global_servers
        return next((text for extension in host.extensions
                     if (text := extension.rejoin_refusal(shards)) is not None), None)

    def _send_compression(self, member: Member) -> None:
        """Tell a rejoined local server the master's WAN compression (not awaited: it handles it once it has its
        address book)."""
        host = self.host
        spec = host.encoding.wan_spec
        if spec is None:
            return
        body = encode_body(ConfigureBody(compression=spec))
        future = host.requests.call(member.id, Message(Kind.CONFIGURE, body=body))

        def refused(result: Future[Message]) -> None:
            if result.exception() is not None:
                log.error("[%s] %s refused the WAN compression: %s", host.name, member.name, result.exception())

        future.add_done_callback(refused)
