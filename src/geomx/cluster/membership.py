"""Who is in the job: members, address books, and registering with a scheduler.

Every node binds a free port, then sends REGISTER (its role, party, address and requested rank) to its
scheduler: a party's local scheduler, or the global scheduler. When every expected member has arrived the
scheduler assigns ranks and answers each with the address book of its tier.

Usage::

    book, me = register(van, requests, "127.0.0.1:9000", GLOBAL_SCHEDULER_ID, role=Role.LOCAL_SERVER,
                        party="dc1", rank=None, timeout=60)
    servers = book.of_role(Role.GLOBAL_SERVER)

    # or, for a node (server or worker): register and connect to the members it talks to, in one call
    book, me = join(van, requests, node_config, Tier.PARTY, rank=None, connect=is_server)
"""

from __future__ import annotations

import collections
import enum
import logging
import os
import secrets
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import asdict, dataclass
from typing import Any

from ..config import Mode, NodeConfig, Role
from ..protocol.wire import Kind, Message
from ..transport.rpc import RemoteError, Requests, RequestTimeout
from ..transport.van import Van
from .heartbeat import pulse_for

log = logging.getLogger("geomx.cluster.membership")

GLOBAL_SCHEDULER_ID = "global_scheduler"
# a registration unanswered this long names the scheduler and what the connection to it says (well within 10 s)
NOTICE_S = 3.0
POLL_S = 0.25  # how often a registration wait looks at the connection (a refusal ends it at once)


class JoinRefused(ConnectionError):
    """This node cannot join, and waiting would not help: the scheduler refused its connection (its shared secret or
    key) or its registration (the party is registered already, say), or the scheduler stopped while it waited."""


SCHEDULERS = (Role.GLOBAL_SCHEDULER, Role.LOCAL_SCHEDULER)
SERVERS = (Role.GLOBAL_SERVER, Role.LOCAL_SERVER)


class Tier(enum.StrEnum):
    """Which scheduler a node registers with: the job's global one, or its own party's."""

    GLOBAL = "global"
    PARTY = "party"


def local_scheduler_id(party: str) -> str:
    return f"{party}/scheduler"


def new_node_id(role: Role, party: str) -> str:
    """A unique ZeroMQ identity for this process (ranks are known only after registration)."""
    return f"{party}/{role.value}/{os.getpid()}-{secrets.token_hex(3)}"


@dataclass(frozen=True)
class Member:
    """One registered node."""

    id: str
    role: Role
    party: str
    rank: int
    address: str
    master: bool = False  # the master worker: the only one allowed to configure the servers

    @property
    def name(self) -> str:
        """A short human name for logs: ``dc1/worker1``, ``dc1/server``, ``global_server0``."""
        if self.role is Role.WORKER:
            return f"{self.party}/worker{self.rank}"
        if self.role is Role.LOCAL_SERVER:
            return f"{self.party}/server"
        if self.role is Role.GLOBAL_SERVER:
            return f"global_server{self.rank}"
        if self.role is Role.LOCAL_SCHEDULER:
            return f"{self.party}/scheduler"
        return "global_scheduler"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["role"] = self.role.value
        return data

    @staticmethod
    def from_json(data: dict[str, Any]) -> Member:
        return Member(str(data["id"]), Role(data["role"]), str(data["party"]), int(data["rank"]),
                      str(data["address"]), bool(data.get("master", False)))


@dataclass(frozen=True)
class AddressBook:
    """The members of one tier, as the scheduler announced them."""

    members: tuple[Member, ...]

    def of_role(self, role: Role, party: str | None = None) -> list[Member]:
        found = [m for m in self.members if m.role is role and (party is None or m.party == party)]
        return sorted(found, key=lambda m: (m.party, m.rank))

    def get(self, member_id: str) -> Member:
        for member in self.members:
            if member.id == member_id:
                return member
        raise KeyError(member_id)

    def names(self) -> dict[str, str]:
        return {m.id: m.name for m in self.members}

    def wan_share(self, party: str, dest_party: str) -> int:
        """How many members of ``party`` send over the WAN to ``dest_party`` (they share that pipe).

        Servers talk to clients and clients to servers; a member counts if any counterpart sits in
        ``dest_party``.
        """
        servers = {Role.GLOBAL_SERVER}
        count = 0
        for member in self.members:
            if member.party != party or member.role in (Role.GLOBAL_SCHEDULER, Role.LOCAL_SCHEDULER):
                continue
            is_server = member.role in servers
            if any(other.party == dest_party and (other.role in servers) != is_server
                   and other.role not in (Role.GLOBAL_SCHEDULER, Role.LOCAL_SCHEDULER)
                   for other in self.members):
                count += 1
        return max(count, 1)


def register(van: Van, requests: Requests, scheduler_address: str, scheduler_id: str, *, role: Role,
             party: str, scheduler_party: str, rank: int | None, timeout: float,
             master: bool = False) -> tuple[AddressBook, Member]:
    """Register with a scheduler and wait for the address book; returns it and this node's own entry.

    ``scheduler_party``: where the scheduler runs (the central party for the global scheduler), which
    decides whether registration crosses the WAN. Once registered, the node sends the scheduler
    heartbeats until its van stops (see ``geomx.cluster.heartbeat``).
    """
    if not van.knows(scheduler_id):
        van.add_peer(scheduler_id, f"tcp://{scheduler_address}", party=scheduler_party, watch=True)
    body = {"role": role.value, "party": party, "address": van.address, "rank": rank, "master": master}
    future = requests.call(scheduler_id, Message(Kind.REGISTER, body=body))
    reply = _await_book(van, future, timeout, scheduler_address, scheduler_id)
    members = tuple(Member.from_json(m) for m in (reply.body or {}).get("members", []))
    book = AddressBook(members)
    requests.names.setdefault(scheduler_id, scheduler_id)
    pulse_for(van, requests, van.topology.timeouts).watch(scheduler_id)  # from now on: heartbeats
    return book, book.get(van.identity)


def _await_book(van: Van, future: Future[Message], timeout: float, address: str, scheduler_id: str) -> Message:
    """The scheduler's answer to REGISTER. Looks at the connection as it waits: a scheduler that refused this
    node's credentials or its registration ends the wait at once, as does one whose connection dropped and that no
    longer listens (JoinRefused: one line, no traceback where ``geomx.node`` runs), one unanswered after NOTICE_S
    is named in a warning with what the connection says (nothing listens, or it runs and waits for the other
    members), and a timeout names it first."""
    who = "the global scheduler" if scheduler_id == GLOBAL_SCHEDULER_ID else f"the scheduler {scheduler_id}"
    started = time.monotonic()
    noticed = False
    while True:
        waited = time.monotonic() - started
        try:
            return future.result(timeout=max(0.0, min(POLL_S, timeout - waited)))
        except FutureTimeout:
            pass
        except RemoteError as exc:  # its refusal, as "<name> refused the request: <why>": the why is what to say
            why = str(exc).partition(" refused the request: ")[2] or str(exc)
            raise JoinRefused(f"[{van.name}] {who} at {address} refused this node's registration: {why}") from None
        reach = van.watches.reaches.get(scheduler_id)
        if reach is not None and reach.refusal is not None:
            raise JoinRefused(f"[{van.name}] {who} at {address} {reach.refusal}")
        if reach is not None and reach.gone:  # it stopped: this node's REGISTER went with it, nobody will answer
            raise JoinRefused(f"[{van.name}] {who} at {address} stopped before this node's registration completed: "
                              f"{reach.describe()}{_hint(reach)}")
        waited = time.monotonic() - started
        state = reach.describe() if reach is not None else "no answer"
        if waited >= timeout:
            raise RequestTimeout(f"[{van.name}] {who} at {address} did not complete this node's registration "
                                 f"within {timeout:g} s: {state}" + _hint(reach))
        if not noticed and waited >= NOTICE_S and (reach is None or not reach.handshaken):
            noticed = True
            log.warning("[%s] waiting for %s at %s (%.0f s so far): %s%s", van.name, who, address, waited, state,
                        _hint(reach))


def _hint(reach: Any) -> str:
    if reach is not None and reach.handshaken:
        return "; it waits for the job's other members to start"
    if reach is not None and reach.dropped:
        return "; did it fail or was it stopped? (its own log says why)"
    return "; is it running, and is this its address?"


def expected_members(config: NodeConfig) -> collections.Counter[tuple[Role, str | None]]:
    """(role, party) -> count the scheduler of ``config`` waits for; party None means any party."""
    topology = config.topology
    expected: collections.Counter[tuple[Role, str | None]] = collections.Counter()
    if config.role is Role.GLOBAL_SCHEDULER:
        known = topology.parties_known
        expected[(Role.GLOBAL_SERVER, topology.central if known else None)] = topology.num_global_servers
        for party in topology.parties:
            # flat, or a collective party: its workers are the global servers' clients themselves
            direct = topology.mode is Mode.FLAT or topology.is_collective(party.name)
            role, count = (Role.WORKER, party.num_workers) if direct else (Role.LOCAL_SERVER, 1)
            expected[(role, party.name if known else None)] += count
    else:
        expected[(Role.LOCAL_SERVER, config.party)] = 1
        expected[(Role.WORKER, config.party)] = config.num_workers
    return expected


def join(van: Van, requests: Requests, config: NodeConfig, tier: Tier, *, rank: int | None,
         connect: Callable[[Member], bool], master: bool = False) -> tuple[AddressBook, Member]:
    """Register ``config``'s node with the scheduler of ``tier`` and connect to the members ``connect`` picks.

    The one way servers and workers join the job: the scheduler's address and id, the registration timeout
    and each link's WAN share all come from ``config``; the book's names go to ``requests`` for messages.

    Usage: ``book, me = join(van, requests, cfg, Tier.GLOBAL, rank=cfg.rank, connect=is_not_scheduler)``
    """
    if tier is Tier.GLOBAL:
        address, where = config.global_scheduler, config.topology.central
    elif config.scheduler is None:
        raise ValueError(f"{config.role.value} of party {config.party!r} must join its party's scheduler, "
                         "but no party scheduler address is configured (GEOMX_SCHEDULER / DMLC_PS_ROOT_URI)")
    else:
        address, where = config.scheduler, config.party
    scheduler = scheduler_id(config, tier)
    book, me = register(van, requests, address, scheduler, role=config.role, party=config.party,
                        scheduler_party=where, rank=rank, timeout=registration_s(config, tier), master=master)
    for member in book.members:
        if member.id != van.identity and connect(member):
            van.add_peer(member.id, member.address, member.party, share=book.wan_share(config.party, member.party))
    requests.names.update(book.names())
    return book, me


def registration_s(config: NodeConfig, tier: Tier) -> float:
    """How long registering with ``tier``'s scheduler may take. A party's tier under HiPS waits twice the topology's
    ``timeouts.register``: its local server first registers with the global tier (up to that long), so a party's
    scheduler must not give up before it, and a global scheduler nobody runs is named first, by the server.

    Usage: ``scheduler_timeout = registration_s(node_config, Tier.PARTY)``
    """
    register = config.topology.timeouts.register_s
    return 2 * register if tier is Tier.PARTY and config.topology.mode is Mode.HIPS else register


def scheduler_id(config: NodeConfig, tier: Tier) -> str:
    """The id of the scheduler of ``tier`` for ``config``'s node (to say goodbye to it)."""
    return GLOBAL_SCHEDULER_ID if tier is Tier.GLOBAL else local_scheduler_id(config.party)


def is_server(member: Member) -> bool:
    """A ``join`` filter: connect to the servers of the book (what a worker talks to)."""
    return member.role in SERVERS


def is_not_scheduler(member: Member) -> bool:
    """A ``join`` filter: connect to every node of the book (what a server talks to)."""
    return member.role not in SCHEDULERS
