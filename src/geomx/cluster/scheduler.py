"""Schedulers: gather registrations, assign ranks, publish the address book, wait for goodbyes.

The global scheduler's tier holds the global servers and the local servers (under a flat parameter server: the
global servers and every worker). A party's local scheduler holds its local server and workers (and a collective
party's ranks, which talk to the global tier themselves). Once the job is complete, the global scheduler still takes
one kind of registration: a restarted party's local server in place of its local server declared dead, or a restarted
collective party's rank in place of its dead rank of the same RANK (a rejoin; the global servers are told with a
MEMBERS notice before the newcomer gets the address book); one whose old self still sends heartbeats after it
registered is the party started twice, refused within a few heartbeat intervals.

Usage (what ``python -m geomx.node`` does for a scheduler role)::

    Scheduler(node_config).run()      # returns the process exit code
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from concurrent.futures import wait
from dataclasses import dataclass
from typing import Any

from ..config import NodeConfig, Role
from ..protocol.bodies import BodyError, HeartbeatBody, MembersNotice, ShutdownNotice, decode_body, encode_body
from ..protocol.wire import Kind, Message
from ..runs.findings import LOST, UNREGISTERED, record_finding
from ..transport.rpc import Requests
from ..transport.van import Van
from .heartbeat import Watch
from .membership import GLOBAL_SCHEDULER_ID, Member, Tier, expected_members, local_scheduler_id, registration_s
from .status import MemberRow, StatusBoard
from .status_page import StatusServer

log = logging.getLogger("geomx.cluster.scheduler")


@dataclass
class _Registration:
    message: Message
    role: Role
    party: str
    address: str
    requested_rank: int | None
    master: bool


def assign_ranks(registrations: list[_Registration]) -> list[int]:
    """Ranks per (role, party): requested ranks first, the master worker at 0, the rest fill the gaps."""
    ranks: list[int | None] = [None] * len(registrations)
    groups: dict[tuple[Role, str], list[int]] = collections.defaultdict(list)
    for index, reg in enumerate(registrations):
        groups[(reg.role, reg.party if reg.role is not Role.GLOBAL_SERVER else "")].append(index)
    for (role, _), indices in groups.items():
        taken: set[int] = set()
        indices = sorted(indices, key=lambda i: not registrations[i].master)  # the master claims 0 first
        for index in indices:
            reg = registrations[index]
            wanted = 0 if reg.master else reg.requested_rank
            if role is Role.LOCAL_SERVER:
                wanted = 0
            if wanted is not None and wanted not in taken and 0 <= wanted < len(indices):
                ranks[index] = wanted
                taken.add(wanted)
        free = iter(r for r in range(len(indices)) if r not in taken)
        for index in indices:
            if ranks[index] is None:
                ranks[index] = next(free)
    return [r if r is not None else 0 for r in ranks]


class Scheduler:
    """One scheduler process (global or local). See the module docstring."""

    def __init__(self, config: NodeConfig) -> None:
        if config.role not in (Role.GLOBAL_SCHEDULER, Role.LOCAL_SCHEDULER):
            raise ValueError(f"Scheduler cannot play role {config.role.value}")
        self.config = config
        self.is_global = config.role is Role.GLOBAL_SCHEDULER
        identity = GLOBAL_SCHEDULER_ID if self.is_global else local_scheduler_id(config.party)
        self.name = "global_scheduler" if self.is_global else f"{config.party}/scheduler"
        self.expected = expected_members(config)
        self._registrations: dict[str, _Registration] = {}
        self._members: list[Member] = []
        self._goodbyes: set[str] = set()
        self._replaced: dict[str, str] = {}  # dead member id -> the id of the restarted member that took its place
        # restarted members whose old one is not declared dead yet: (when it registered, sender, registration)
        self._waiting: list[tuple[float, str, _Registration]] = []
        self._heard: dict[str, float] = {}  # member id -> its last heartbeat (time.monotonic(), the I/O thread's)
        self._lock = threading.Lock()
        self._complete = threading.Event()
        self._finished = threading.Event()
        self._watch: Watch | None = None  # members' heartbeats, from the moment the book is published
        self.board = StatusBoard(config.topology, owner=self.name)  # the status page's data (a party's: relayed)
        self._bad_reports: set[str] = set()  # members whose heartbeat report was malformed (logged once each)
        self.van = Van(identity, config.party, config.topology, self._on_message,
                       bind_host=config.bind_host, bind_port=config.bind_port, name=self.name)
        self.van.heartbeat_hook = self._on_heartbeat
        self.requests = Requests(self.van)

    def _on_message(self, message: Message) -> None:
        sender = message.sender.decode()
        if message.is_reply:
            if not self.requests.resolve(message):
                log.warning("[%s] ignored a reply from %r that answers nothing asked", self.name, sender)
            return
        if message.kind is Kind.REGISTER:
            self._on_register(sender, message)
        elif message.kind is Kind.SHUTDOWN:
            try:
                failed = decode_body(ShutdownNotice, message.body or {}).failed
            except BodyError as exc:  # still a goodbye: the member stops either way
                failed = f"(a malformed goodbye: {exc})"
            with self._lock:
                if self._watch is None or sender not in self._watch.names:
                    log.warning("[%s] ignored a goodbye from %r, which is not a member", self.name, sender)
                    return
                self._goodbyes.add(sender)
                if failed and self._watch is not None:  # it stopped on a fatal error: its peers must know
                    self._watch.declare(sender, f"stopped after a fatal error: {str(failed)[:500]}")
                    log.error("[%s] %s stopped after a fatal error: %s", self.name,
                              self._watch.names.get(sender, sender), failed)
                self._check_finished()
        elif message.kind is Kind.STATS and self.van.knows(sender):
            self.van.send(sender, message.reply(body=self.van.counters.snapshot()))
        else:
            log.warning("[%s] ignored %s from %r", self.name, message.kind.name, sender)

    def _on_heartbeat(self, message: Message) -> bool:
        """A member is alive (I/O thread): answer with the members declared dead so far."""
        watch = self._watch
        sender = message.sender.decode(errors="replace")
        if message.is_reply or watch is None or not watch.heard(sender):
            return False
        self._heard[sender] = time.monotonic()  # alive: a restarted twin of it waits in vain (_admit_waiting)
        answer: dict[str, Any] = {"dead": watch.snapshot()}
        if not self.is_global and self._is_party_server(sender):  # relayed to the global scheduler's page
            with self._lock:
                rows = [row for row in self._rows() if row.role == Role.WORKER.value]
            answer["party"] = self.board.members(rows)
        self.van.send(sender, message.reply(body=answer))
        if message.body:
            try:
                self.board.heard(sender, decode_body(HeartbeatBody, message.body), name=watch.names.get(sender))
            except BodyError as exc:
                if sender not in self._bad_reports:
                    self._bad_reports.add(sender)
                    log.warning("[%s] ignored the report in %s's heartbeats: %s", self.name,
                                watch.names.get(sender, sender), exc)
        return True

    def _is_party_server(self, sender: str) -> bool:
        return any(m.id == sender and m.role is Role.LOCAL_SERVER for m in self._members)

    def status(self) -> dict[str, Any]:
        """The status page's snapshot (an HTTP thread asks; the lock is held only to copy the members' states)."""
        with self._lock:
            rows, missing = self._rows(), self.missing()
            phase = ("finished" if self._finished.is_set() else "training" if self._complete.is_set()
                     else "registering")
        return self.board.snapshot(rows, missing, phase)

    def _rows(self) -> list[MemberRow]:
        """Every member with its state (under the lock): before the book, those registered so far (waiting)."""
        if not self._complete.is_set():
            return [MemberRow(i, f"{r.party}/{r.role.value}", r.role.value, r.party, r.requested_rank, "waiting")
                    for i, r in self._registrations.items()]
        dead = self._dead_ids()
        rows = [MemberRow(m.id, m.name, m.role.value, m.party, m.rank,
                          "dead" if m.id in dead else "left" if m.id in self._goodbyes else "training")
                for m in self._members]
        return rows + [MemberRow(sender, f"{reg.party}/{reg.role.value} (restarted)", reg.role.value, reg.party,
                                 reg.requested_rank, "rejoining") for _, sender, reg in self._waiting]

    def _check_finished(self) -> None:
        """Done when every member said goodbye or was declared dead (called under the lock)."""
        if not self._complete.is_set():
            return
        dead = set(self._watch.dead) if self._watch is not None else set()
        if self._goodbyes | dead >= {m.id for m in self._members}:
            self._finished.set()

    def _refuse(self, sender: str, address: str, party: str, message: Message, text: str) -> None:
        log.error("[%s] refused registration from %s: %s", self.name, sender, text)
        if address.startswith("tcp://"):
            self.van.add_peer(sender, address, party)
            self.van.send(sender, message.error(text))

    def _on_register(self, sender: str, message: Message) -> None:
        body = message.body or {}
        try:
            role = Role(str(body.get("role")))
            party = str(body["party"])
            address = str(body["address"])
            requested = body.get("rank")
            requested_rank = int(requested) if requested is not None else None
        except (ValueError, KeyError, TypeError) as exc:
            log.error("[%s] malformed REGISTER from %r: %s", self.name, sender, exc)
            return
        with self._lock:
            if self._complete.is_set():
                registration = _Registration(message, role, party, address, requested_rank, False)
                replaced = self._replaceable(role, party, requested_rank, dead_only=False)
                if replaced is None:
                    self._refuse(sender, address, party, message,
                                 f"registration is closed; the job already has all its {sum(self.expected.values())}"
                                 " members (only a restarted party's local server, or a collective party's ranks, "
                                 "may join later)")
                elif replaced.id in self._dead_ids():
                    self._rejoin(sender, replaced, registration)
                else:  # restarted at once: its old self is not declared dead yet
                    self._waiting.append((time.monotonic(), sender, registration))
                    log.warning("[%s] a restarted %s of %s waits until the old one is declared dead", self.name,
                                role.value, party)
                return
            key: tuple[Role, str | None] = (role, party) if (role, party) in self.expected else (role, None)
            have = sum(1 for r in self._registrations.values()
                       if r.role is role and (key[1] is None or r.party == party))
            if self.expected.get(key, 0) <= have:
                wanted = {f"{r.value}@{p}": n for (r, p), n in self.expected.items()}
                twice = f"party {party!r} is already registered (is it started twice?): " \
                    if self.is_global and have and key[1] is not None else ""
                self._refuse(sender, address, party, message,
                             f"{twice}unexpected {role.value} from party {party!r}; this scheduler expects {wanted}")
                return
            self._registrations[sender] = _Registration(message, role, party, address, requested_rank,
                                                        bool(body.get("master")))
            self.board.seen(sender, party)
            log.info("[%s] registered %s of %s (%d/%d)", self.name, role.value, party,
                     len(self._registrations), sum(self.expected.values()))
            if len(self._registrations) == sum(self.expected.values()):
                self._publish()

    def _publish(self) -> None:
        ids = list(self._registrations)
        regs = [self._registrations[i] for i in ids]
        ranks = assign_ranks(regs)
        topology = self.config.topology
        self._members = [
            Member(i, r.role, r.party, rank, r.address,
                   master=r.role is Role.WORKER and (r.master or (topology.parties_known and rank == 0
                                                                  and r.party == topology.central)))
            for i, r, rank in zip(ids, regs, ranks, strict=True)]
        book = {"members": [m.to_json() for m in self._members]}
        self._watch = Watch(self.config.topology.timeouts, {m.id: m.name for m in self._members}, self.name)
        for member, reg in zip(self._members, regs, strict=True):
            self.van.add_peer(member.id, member.address, member.party)
            self.van.send(member.id, reg.message.reply(body=book))
        self._complete.set()
        log.info("[%s] all %d members registered", self.name, len(self._members))

    def _dead_ids(self) -> set[str]:
        return set(self._watch.snapshot()) if self._watch is not None else set()

    def _replaceable(self, role: Role, party: str, rank: int | None, dead_only: bool = True) -> Member | None:
        """The (dead) member a restarted one may replace (global scheduler only): ``party``'s local server, or the
        rank ``rank`` of a collective party (its ranks talk to the global tier themselves)."""
        collective = role is Role.WORKER and party in self.config.topology.collective_parties
        if not self.is_global or not (role is Role.LOCAL_SERVER or collective) or self._finished.is_set():
            return None
        dead = self._dead_ids()
        return next((m for m in self._members if m.role is role and m.party == party
                     and (not collective or m.rank == rank)
                     and (m.id in dead or (not dead_only and m.id not in self._goodbyes))), None)

    def _admit_waiting(self) -> None:
        """Restarted members waiting for their old one's death (under the lock): admitted once it is declared dead;
        refused once it sends a heartbeat two intervals after they registered (it runs: the party was started twice;
        a dead one's last heartbeat left before its successor started), or after twice the heartbeat timeout."""
        timeouts, waiting, self._waiting = self.config.topology.timeouts, self._waiting, []
        for since, sender, reg in waiting:
            if (old := self._replaceable(reg.role, reg.party, reg.requested_rank)) is not None:
                self._rejoin(sender, old, reg)
                continue
            live = self._replaceable(reg.role, reg.party, reg.requested_rank, dead_only=False)
            alive = live is not None and self._heard.get(live.id, 0.0) > since + 2 * timeouts.heartbeat_interval_s
            if not alive and time.monotonic() < since + 2 * timeouts.heartbeat_s and not self._finished.is_set():
                self._waiting.append((since, sender, reg))
                continue
            rank = f" of rank {reg.requested_rank}" if reg.role is Role.WORKER else ""
            self._refuse(sender, reg.address, reg.party, reg.message,
                         f"party {reg.party!r} is already registered: its {reg.role.value}{rank} "
                         f"{'still runs' if alive else 'is not declared dead'} (is the party started twice? a "
                         "restarted party rejoins only in place of one declared dead)")

    def _rejoin(self, sender: str, old: Member, reg: _Registration) -> None:
        """A restarted party's local server takes the dead one's place (under the lock): the global servers are
        told first (they take it as a client, or refuse where the algorithm needs every party), then it gets
        the address book."""
        assert self._watch is not None
        new = Member(sender, old.role, old.party, old.rank, reg.address)
        self._members = [new if m.id == old.id else m for m in self._members]
        self._replaced[old.id] = sender
        self._watch.add(sender, new.name)
        self.board.seen(sender, new.party)
        self.board.rejoined(new.party)  # its steps count from its restart: its model digests are not the job's
        self.van.add_peer(sender, reg.address, reg.party)
        gone = self._goodbyes | self._dead_ids()
        servers = [m for m in self._members if m.role is Role.GLOBAL_SERVER and m.id not in gone]
        notice = encode_body(MembersNotice(member=new.to_json(), replaces=old.id))
        futures = [self.requests.call(m.id, Message(Kind.MEMBERS, body=notice)) for m in servers]
        log.warning("[%s] %s of %s rejoins in place of the one declared dead; telling %d global servers",
                    self.name, reg.role.value, reg.party, len(servers))
        book = {"members": [m.to_json() for m in self._members]}
        timeout = self.config.topology.timeouts.request_s

        def answer() -> None:
            done, pending = wait(futures, timeout)
            errors = [str(f.exception()) for f in done if f.exception() is not None]
            errors += [f"no answer from a global server within {timeout:g} s"] * len(pending)
            with self._lock:
                if errors:
                    text = "; ".join(errors)
                    self._watch.declare(sender, f"its rejoin was refused: {text}")  # type: ignore[union-attr]
                    self._refuse(sender, reg.address, reg.party, reg.message, f"cannot rejoin: {text}")
                    self._check_finished()
                    return
                self.van.send(sender, reg.message.reply(body=book))
                log.info("[%s] %s rejoined", self.name, new.name)

        threading.Thread(target=answer, name=f"{self.name}-rejoin", daemon=True).start()

    def missing(self) -> dict[str, int]:
        counts = collections.Counter((r.role, r.party) for r in self._registrations.values())
        missing = {}
        for (role, party), n in self.expected.items():
            have = counts[(role, party)] if party else sum(v for (r, _), v in counts.items() if r is role)
            if have < n:
                missing[f"{role.value}@{party or '*'}"] = n - have
        return missing

    def _start_page(self) -> StatusServer | None:
        """The global scheduler's status page, if the topology wants it; a port it cannot bind is one error line,
        and the job runs on without the page."""
        spec = self.config.topology.status
        if not self.is_global or not spec.enabled:
            return None
        try:
            page = StatusServer(spec.host, spec.port, self.status).start()
        except OSError as exc:
            log.error("[%s] the status page cannot listen at %s:%d (%s); the job runs without it", self.name,
                      spec.host, spec.port, exc.strerror or exc)
            return None
        log.info("[%s] status : %s", self.name, page.url)
        return page

    def run(self) -> int:
        """Serve until every member said goodbye or died. Exit code 0; 1 if registration timed out; 4 if a
        member died (each one is logged when it is declared dead)."""
        self.van.start()
        log.info("[%s] listening at %s", self.name, self.van.address)
        page = self._start_page()
        try:
            return self._serve()
        finally:
            if page is not None:
                page.stop()

    def _serve(self) -> int:
        timeout = registration_s(self.config, Tier.GLOBAL if self.is_global else Tier.PARTY)
        if not self._complete.wait(timeout):
            log.error("[%s] registration timed out after %g s; still missing %s", self.name, timeout,
                      self.missing())
            record_finding(self.config.run_dir, self.name, {"what": UNREGISTERED, "clients": list(self.missing()),
                                                            "waited_s": timeout})  # (the summary names them)
            for sender, reg in list(self._registrations.items()):
                self._refuse(sender, reg.address, reg.party, reg.message,
                             f"{self.name}: registration timed out; missing {self.missing()}")
            self.van.stop()
            return 1
        assert self._watch is not None
        interval = self.config.topology.timeouts.heartbeat_interval_s
        while not self._finished.wait(interval):
            with self._lock:
                for member, why in self._watch.check(self._goodbyes):
                    log.error("[%s] %s is dead: %s", self.name, self._watch.names.get(member, member), why)
                self._admit_waiting()
                self._check_finished()
        self.van.stop()
        dead = {m: why for m, why in self._watch.snapshot().items() if m not in self._replaced}
        for old in self._replaced:
            log.info("[%s] a lost %s was replaced by a restarted one", self.name, self._watch.names.get(old, old))
        if dead:
            lost = {self._watch.names.get(m, m): why for m, why in dead.items()}
            log.error("[%s] exiting; members lost: %s", self.name, ", ".join(f"{n} ({why})" for n, why in lost.items()))
            # (the summary names the lost member, not this scheduler's exit code 4)
            record_finding(self.config.run_dir, self.name, {"what": LOST, "clients": list(lost), "why": lost})
            return 4
        log.info("[%s] every member left; exiting", self.name)
        return 0
