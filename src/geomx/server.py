"""Parameter servers: the local server of a party and the global server(s) of the central party.

Both run the same round machinery per (key, slice): collect the clients' contributions, reduce them
(servers **sum**), and release the result to every contributor in one reply (push and pull fused). A local
server's reduction goes one tier up as a single request to the owning global server, and the global
server's answer comes back down; a global server applies its optimizer (if one is set) to the sum and
answers with the new weights, or answers with the sum itself.

Every message is validated; a bad one gets an ERROR reply naming the problem, and the server goes on.
Every round has a deadline; a round that misses it fails with the names of the clients it waited for.

Usage (what ``python -m geomx.node`` does for a server role)::

    ParameterServer(node_config).run()      # returns the process exit code
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from .checkpoint import CheckpointWriter, Snapshot
from .codecs import CodecError, TensorInfo, default_registry
from .codecs import Codec as TensorCodec
from .codecs.base import TensorKind
from .codecs.messages import decode_message, payload_fields
from .compose import DEFAULT_SYNC, compose, configured_policy
from .config import Mode, NodeConfig, Role
from .config.combinations import configure_facts, refusal
from .core.checkpoints import checkpoint_if_due, restore_optimizer, resume, slots_of
from .core.clients import Clients
from .core.early import EarlyAnswers, send_early
from .core.inits import Inits, slot_mismatch
from .core.plugins import Aggregation, Route
from .core.rounds import Round, RoundId, RoundTable, Slot
from .heartbeat import pulse_for
from .membership import GLOBAL_SCHEDULER_ID, Member, Tier, is_not_scheduler, join, local_scheduler_id, new_node_id
from .rpc import Requests
from .runlog import write_stats
from .trace import Tracer
from .transport import Van
from .wire import Kind, Message

if TYPE_CHECKING:  # geomx.optim imports torch (~1 s per process): only a global server that gets one loads it
    from .optim import Optimizer

log = logging.getLogger("geomx.server")

def _build_optimizer(spec: Any) -> Optimizer:
    from .optim import optimizer_from_spec  # imports torch: global servers that get an optimizer only

    return optimizer_from_spec(spec)


class ParameterServer:
    """A local or global parameter server process. See the module docstring."""

    def __init__(self, config: NodeConfig) -> None:
        if config.role not in (Role.LOCAL_SERVER, Role.GLOBAL_SERVER):
            raise ValueError(f"ParameterServer cannot play role {config.role.value}")
        self.config = config
        self.is_global = config.role is Role.GLOBAL_SERVER
        self.name = f"global_server{config.rank or 0}" if self.is_global else f"{config.party}/server"
        self.identity = new_node_id(config.role, config.party)
        self.optimizer: Optimizer | None = None
        self.slots: dict[tuple[int, int], Slot] = {}
        # ESync: a rejoined client's rounds are held (clients.joining) until the others finish their current
        # cycle (the next STATE round), so that its first push meets their first push of the next cycle.
        self.clients = Clients()
        # The algorithms, chosen once from the config (geomx.compose): rounds of pushes follow the sync policy
        # (the master may set another on the global servers; local servers stay synchronous) and INIT, BARRIER
        # and SHUTDOWN rounds always wait for every client; the route carries values between tiers (direct, or
        # TSEngine's overlays); the aggregation says what a tier does with a sum (the plain sum, or HFA's model
        # averages and deltas); extensions add request kinds (ESync's speed reports).
        plugins = compose(config, self)
        self.table = RoundTable(self, self.clients, plugins.policy)
        self.route = plugins.route
        self.route_handlers = self.route.handlers()
        self.aggregation = plugins.aggregation
        self.early_answers = EarlyAnswers()  # a local server's early answers (geomx.core.early)
        self.extra_handlers = plugins.requests()
        self.completions = plugins.completions()
        self.configurers: set[str] = set()  # clients allowed to set the optimizer (the master worker's path)
        self.upstream: list[str] = []
        self.inits = Inits(self, self.is_global)  # INIT requests and rounds, the slices' shards
        self.upstream_addresses: dict[str, str] = {}  # the global servers' addresses (a local server's)
        self.peers: set[str] = set()  # a local server's fellow local servers
        self._lock = threading.RLock()
        self._ready = False
        self._early: list[Message] = []
        self._done = threading.Event()
        self._fatal: str | None = None  # why this server had to stop (a client or its global server died)
        self._stop_watchdog = threading.Event()
        self.van = Van(self.identity, config.party, config.topology, self._on_message,
                       bind_host=config.bind_host, name=self.name)
        self.van.tracer = Tracer.for_node(config.trace, config.run_dir, self.name)
        self.requests = Requests(self.van)
        self.timeouts = config.topology.timeouts
        self.checkpoints: CheckpointWriter | None = None  # global servers with checkpoint.dir set
        self.resumed: Snapshot | None = None  # the checkpoint this global server started from (--resume)
        self.codecs = default_registry()  # every server decodes whatever arrives by the payload's codec id
        # What values are encoded with (geomx.core.encoding): the fp16 switch (topology ``fp16: true``), filled
        # by the composition root, and the WAN compression the master sets (CONFIGURE): a local server encodes
        # its pushes with it, a global server its replies.
        self.encoding = plugins.encoding

    # -- setup --------------------------------------------------------------------------------------------
    def _join(self) -> list[str]:
        """Register with the scheduler(s), connect to peers; returns the schedulers to say goodbye to."""
        cfg = self.config
        global_book, me = join(self.van, self.requests, cfg, Tier.GLOBAL, rank=cfg.rank, connect=is_not_scheduler)
        schedulers = [GLOBAL_SCHEDULER_ID]
        if self.is_global:
            self.name = me.name
            self.van.name = me.name
            self.inits.shard_id = me.rank
            if cfg.topology.mode is Mode.FLAT:
                self.clients.present = {m.id for m in global_book.of_role(Role.WORKER)}
                self.configurers = {m.id for m in global_book.of_role(Role.WORKER) if m.master}
            else:
                self.clients.present = {m.id for m in global_book.of_role(Role.LOCAL_SERVER)}
                self.configurers = {m.id for m in global_book.of_role(Role.LOCAL_SERVER, cfg.topology.central)}
        else:
            self.upstream = [m.id for m in global_book.of_role(Role.GLOBAL_SERVER)]
            self.inits.shard_owner = {m.rank: m.id for m in global_book.of_role(Role.GLOBAL_SERVER)}
            self.upstream_addresses = {m.id: m.address for m in global_book.of_role(Role.GLOBAL_SERVER)}
            self.peers = {m.id for m in global_book.of_role(Role.LOCAL_SERVER)} - {self.identity}
            local_book, _ = join(self.van, self.requests, cfg, Tier.PARTY, rank=0, connect=is_not_scheduler)
            self.clients.present = {m.id for m in local_book.of_role(Role.WORKER)}
            self.configurers = {m.id for m in local_book.of_role(Role.WORKER) if m.master}
            schedulers.append(local_scheduler_id(cfg.party))
        return schedulers

    def run(self) -> int:
        """Serve until every client has shut down. Returns the process exit code."""
        if self.config.resume and self.is_global and not self._resume():
            return 2
        self.van.start()
        schedulers = self._join()
        self.route.start()
        spec = self.config.topology.checkpoint
        if self.is_global and spec.dir is not None:
            self.checkpoints = CheckpointWriter(spec, self.config.rank or 0, self.name)
        log.info("[%s] serving %d clients%s", self.name, len(self.clients),
                 f", upstream {len(self.upstream)} global servers" if self.upstream else "")
        with self._lock:
            self._ready = True
            early, self._early = self._early, []
            for message in early:
                self._handle(message)
        pulse = pulse_for(self.van, self.requests, self.timeouts)
        pulse.on_dead(self._on_member_dead)
        pulse.on_self_dead(self._on_self_dead)
        watchdog = threading.Thread(target=self._watchdog, name=f"{self.name}-watchdog", daemon=True)
        watchdog.start()
        # bounded: in heartbeat-long slices, giving up (fatally, naming who it waited for) once the threads that
        # would deliver a client's goodbye or notice its death have ended
        while not self._done.wait(self.timeouts.heartbeat_s):
            broken = "the watchdog" if not watchdog.is_alive() else None if self.van.running else "the transport"
            if broken is not None:
                with self._lock:
                    waiting = sorted(self.requests.names.get(c, c) for c in self.clients.remaining())
                    self._stop_fatally(f"stopped waiting for clients {waiting} to shut down: {broken} has ended")
        self._stop_watchdog.set()
        self.route.close()
        with self._lock:
            self.route.stop(self.config.run_dir)
        if self.checkpoints is not None and not self.checkpoints.wait_idle(self.timeouts.shutdown_s):
            log.error("[%s] a checkpoint was still being written at shutdown", self.name)
        for scheduler in schedulers:  # a fatal stop is announced, so the schedulers tell everyone at once
            self.van.send(scheduler, Message(Kind.SHUTDOWN, body={"failed": self._fatal} if self._fatal else None))
        self.van.flush(self.timeouts.shutdown_s)
        if self.config.run_dir is not None:
            with self._lock:
                leads = self.table.leads_report()
            write_stats(self.config.run_dir, self.name, {"role": self.config.role.value,
                                                         "party": self.config.party,
                                                         "cpu_s": time.process_time(),
                                                         "answer_leads": leads,
                                                         **self.van.counters.snapshot()})
        self.van.stop()
        if self._fatal:
            log.error("[%s] stopped: %s", self.name, self._fatal)
            return 4
        log.info("[%s] shut down", self.name)
        return 0

    def _on_member_dead(self, member: str, why: str) -> None:
        """Heartbeats say ``member`` is dead. Where the algorithm allows it (``_may_drop``) the client is dropped
        from the rounds and the others go on; elsewhere the rounds need it: stop, naming it."""
        name = self.requests.names.get(member, member)
        with self._lock:
            if member in self.clients.remaining():
                if self._may_drop():
                    self._drop(member, name, why)
                    return
                tier = self.table.policy.name if self.is_global else "the local tier"
                self._stop_fatally(f"{name} is dead ({why}); {tier} cannot go on without it")
            elif member in self.upstream:
                self._stop_fatally(f"{name} is dead ({why}); this party cannot train without it")

    def _on_self_dead(self, text: str) -> None:
        """Our scheduler declared this server dead (cut off or frozen too long): its peers have moved on."""
        with self._lock:
            self._stop_fatally(text)

    def _may_drop(self) -> bool:
        """Whether a dead client is dropped instead of stopping: in every tier of an elastic job, and in a global
        tier whose policy lets clients leave on their own (MixedSync); the aggregation may overrule (HFA)."""
        usual = self.config.topology.elastic or (self.is_global and self.table.policy.clients_leave_independently)
        return self.aggregation.may_drop(usual)

    def _drop(self, member: str, name: str, why: str) -> None:
        """Go on without ``member`` (under the lock): open rounds that only waited for it complete now."""
        remaining = self.clients.drop(member, why)
        log.warning("[%s] dropped %s from the rounds (%s); %d of %d clients left", self.name, name, why,
                    len(remaining), len(self.clients))
        if not remaining:
            self._done.set()
            return
        self.route.forget(member)
        self.table.complete_ready()
        self.van.disconnect(member)  # it is gone for good (a restarted party rejoins with a new identity)

    def _rescaled(self, rnd: Round, total: np.ndarray) -> np.ndarray:
        """After a drop or a departure: the sum as the tier's policy applies it, given the workers behind the
        round's contributions and the tier's (FSA scales it to the full tier; MixedSync applies it as it is)."""
        present = sum(self._workers_behind(c) for c in rnd.contributions)
        topology = self.config.topology
        full = topology.num_all_workers if self.is_global else self.config.num_workers
        return self.table.policy.rescale(total, present, full)

    def _workers_behind(self, client: str) -> int:
        """Workers a client speaks for: its party's (a local server's pushes to a global server), else 1."""
        party = self.van.peer_party(client)
        if self.is_global and self.config.topology.mode is Mode.HIPS and party is not None:
            return self.config.topology.party(party).num_workers
        return 1

    def _stop_fatally(self, text: str) -> None:
        """Fail every open round with ``text`` (its clients see who died) and stop the server (under the lock)."""
        if self._fatal is not None:
            return
        self._fatal = text
        log.error("[%s] %s", self.name, text)
        self.table.fail_open(text)
        self._done.set()

    # -- message handling ---------------------------------------------------------------------------------
    def _on_message(self, message: Message) -> None:
        if EarlyAnswers.is_early(message) and message.sender.decode() in self.upstream:
            with self._lock:  # the others' sum, ahead of the answer to our push (geomx.core.early)
                self.early_answers.store(message.sender.decode(), message)
            return
        if message.is_reply:
            if not self.requests.resolve(message):
                log.warning("[%s] reply %d from %r answers no pending request", self.name, message.request_id,
                            message.sender)
            return
        with self._lock:
            if not self._ready:
                self._early.append(message)
                return
            self._handle(message)

    def refuse(self, message: Message, text: str) -> None:
        sender = message.sender.decode()
        log.warning("[%s] refused %s from %s: %s", self.name, message.kind.name,
                    self.requests.names.get(sender, sender), text)
        if self.van.knows(sender):
            self.van.send(sender, message.error(f"{self.name}: {text}"))

    def _handle(self, message: Message) -> None:
        sender = message.sender.decode()
        if self._fatal is not None:
            self.refuse(message, self._fatal)
            return
        if message.kind is Kind.STATS:
            self._on_stats(message)
            return
        route_handler = self.route_handlers.get(message.kind)
        if route_handler is not None:  # the route checks who may send these
            route_handler(message)
            return
        if message.kind is Kind.MEMBERS:
            self._on_members(message)
            return
        from_upstream = message.kind is Kind.CONFIGURE and sender in self.upstream
        if sender not in self.clients and not from_upstream:
            self.refuse(message, f"{sender!r} is not a client of this server")
            return
        if message.kind in (Kind.PUSHPULL, Kind.STATE, Kind.BARRIER) and self.clients.hold(message):
            return  # replayed when the others' cycle ends (RoundTable.admit)
        refusal = self.clients.refusal(sender, self.display(sender))
        if refusal is not None:
            self.refuse(message, refusal)
            return
        handlers: dict[Kind, Callable[[Message], None]] = {
            Kind.INIT: self.inits.request, Kind.PUSHPULL: self._on_pushpull, Kind.PULL: self._on_pull,
            Kind.BARRIER: self._contribute, Kind.SHUTDOWN: self._on_shutdown, Kind.CONFIGURE: self._on_configure,
            **self.extra_handlers,
        }
        if message.encoded is not None:
            try:
                message.tensor = decode_message(self.codecs, message)
            except CodecError as exc:
                self.refuse(message, f"undecodable payload for key {message.key} slice {message.part}: {exc}")
                return
            message.encoded = None
        if message.kind is Kind.PUSHPULL and self.route.holds(message):
            return
        handler = handlers.get(message.kind)
        if handler is None:
            self.refuse(message, f"a server does not handle {message.kind.name} requests")
            return
        handler(message)

    def _on_members(self, message: Message) -> None:
        """The global scheduler admits a restarted party's local server in place of its dead one: take it as a
        client. Rounds already open do not wait for it; it gets the current model from INIT (a late joiner's
        answer) and the master's WAN compression setting now."""
        body = message.body or {}
        sender = message.sender.decode()
        if sender != GLOBAL_SCHEDULER_ID or not self.is_global:
            self.refuse(message, "only the global scheduler announces members, and only to global servers")
            return
        try:
            member = Member.from_json(body["member"])
            old = str(body["replaces"])
        except (KeyError, TypeError, ValueError) as exc:
            self.refuse(message, f"malformed MEMBERS notice: {exc}")
            return
        if old not in self.clients or member.role is not Role.LOCAL_SERVER:
            self.refuse(message, f"{member.name} replaces {old!r}, which is not a local server of this job")
            return
        if not self._may_drop():
            self.refuse(message, f"{self.table.policy.name} cannot take a party back (it needs every party in "
                                  "every round); MixedSync, HFA, ESync and elastic FSA can")
            return
        esync = self.table.has_kind(Kind.STATE)  # only shard 0 sees ESync's state rounds
        if esync and self.config.topology.num_global_servers > 1:
            # The hold that aligns a rejoiner with the others' next cycle (see clients.joining) exists on shard 0
            # only: the other global servers' per-key rounds would take its pushes a cycle apart and deadlock.
            self.refuse(message, "ESync with several global servers cannot take a party back (only global server "
                                  "0 sees the state rounds that align it); restart the whole job with --resume")
            return
        if old not in self.clients.departed:  # its death reached the scheduler before our heartbeat told us
            self._drop(old, self.requests.names.get(old, old), f"replaced by a restarted {member.name}")
        self.van.add_peer(member.id, member.address, member.party)
        self.requests.names[member.id] = member.name
        self.table.exempt_open(member.id)
        self.clients.add(member.id, hold=esync)  # under ESync: join at the others' next cycle
        if member.party == self.config.topology.central:
            self.configurers.add(member.id)
        log.warning("[%s] %s rejoined (replacing the one dropped); %d of %d clients present", self.name,
                    member.name, len(self.clients.remaining()), len(self.clients))
        spec = self.encoding.wan_spec
        if spec is not None:  # not awaited: the new server handles it once it has its address book
            future = self.requests.call(member.id, Message(Kind.CONFIGURE, body={"compression": spec}))
            def refused(result: Future[Message]) -> None:
                if result.exception() is not None:
                    log.error("[%s] %s refused the WAN compression: %s", self.name, member.name, result.exception())

            future.add_done_callback(refused)
        self.van.send(sender, message.reply())

    def owner(self, key: int, part: int) -> str:
        """The global server that holds (key, slice), by the shard id its INIT declared."""
        return self.inits.owner(key, part)

    def _on_pushpull(self, message: Message) -> None:
        slot = self.slots.get((message.key, message.part))
        if slot is None:
            self.refuse(message, f"key {message.key} slice {message.part} was never initialized; call init first")
            return
        if message.tensor is None and self.route.accepts_without_tensor(message):
            self._contribute(message)  # this party's sum travels inside another party's push
            return
        if message.tensor is None:
            self.refuse(message, f"PUSHPULL of key {message.key} carries no tensor")
            return
        problem = slot_mismatch(slot.describe(), message)
        if problem:
            self.refuse(message, problem)
            return
        self._contribute(message)
        self.route.pushed(message)
        if self._answers_early():
            rnd = self.table.get(Kind.PUSHPULL, message.key, message.part)
            if rnd is not None:
                send_early(self, rnd, self.table.awaited(rnd))

    def _answers_early(self) -> bool:
        """Whether this server sends the last party the others' sum early (see geomx.core.early): a HiPS global
        server whose answer is the plain sum of the parties' pushes."""
        return (self.is_global and self.config.topology.early_answers and self.config.topology.mode is Mode.HIPS
                and self.optimizer is None
                and type(self.aggregation) is Aggregation and type(self.route) is Route
                and self.table.policy.name == DEFAULT_SYNC and self.wan_codec is None
                and self.encoding.wide is None)

    def _on_pull(self, message: Message) -> None:
        """The current value. A local server asks its global server: under MixedSync its own copy may be stale."""
        slot = self.slots.get((message.key, message.part))
        sender = message.sender.decode()
        if slot is None:
            self.refuse(message, f"key {message.key} slice {message.part} was never initialized; call init first")
            return
        if self.is_global:
            if self.optimizer is not None:  # DCASGD: the puller's next push is compensated against these
                self.optimizer.received((message.key, message.part), sender, slot.value)
            self.van.send(sender, message.reply(tensor=slot.value))
            return
        owner = self.owner(message.key, message.part)
        future = self.requests.call(owner, Message(Kind.PULL, key=message.key, part=message.part,
                                                   num_parts=message.num_parts, priority=message.priority))

        def answer(result: Future[Message]) -> None:
            error = result.exception()
            reply = message.error(f"{self.name}: {error}") if error else message.reply(tensor=result.result().tensor)
            self.van.send(sender, reply)

        future.add_done_callback(answer)

    def _on_stats(self, message: Message) -> None:
        """Our counters; a local server adds its global servers' under "upstream"."""
        sender = message.sender.decode()
        if not self.van.knows(sender):
            return
        own = {"name": self.name, "role": self.config.role.value, **self.van.counters.snapshot()}
        if self.is_global:
            self.van.send(sender, message.reply(body=own))
            return
        futures = [self.requests.call(gs, Message(Kind.STATS)) for gs in self.upstream]

        def answer(error: str | None) -> None:
            if error:
                self.van.send(sender, message.error(error))
                return
            upstream = {}
            for future in futures:
                body = future.result().body or {}
                upstream[str(body.get("name"))] = body
            self.van.send(sender, message.reply(body={**own, "upstream": upstream}))

        self._when_all(futures, answer)

    def _on_configure(self, message: Message) -> None:
        """Server settings from the master worker: {"optimizer": spec} and/or {"sync": kvstore type}."""
        body = message.body or {}
        sender = message.sender.decode()
        from_upstream = sender in self.upstream  # a global server spreading the compression to every party
        if sender not in self.configurers and not from_upstream:
            self.refuse(message, "only the master worker may configure the servers")
            return
        if from_upstream and set(body) != {"compression"}:
            self.refuse(message, "a global server may only spread the compression setting")
            return
        unknown = set(body) - {"optimizer", "sync", "compression"}
        if unknown or not body:
            self.refuse(message, f"CONFIGURE takes 'optimizer', 'sync' and/or 'compression', got {sorted(body)}")
            return
        try:
            # the global servers build the optimizer (and report a bad spec); a local server only forwards it
            optimizer = _build_optimizer(body["optimizer"]) if "optimizer" in body and self.is_global else None
            options = dict(self.config.topology.training.plugin_options)
            policy = configured_policy(str(body["sync"]), options) if "sync" in body else None
            codec = self.codecs.make_codec(body["compression"]) if "compression" in body else None
        except ValueError as exc:  # CodecError is a ValueError too
            self.refuse(message, str(exc))
            return
        refused = refusal(configure_facts(self.config.topology.features, compression=codec is not None,
                                          other_sync=policy is not None and policy.name != DEFAULT_SYNC))
        if refused is not None:
            self.refuse(message, refused)
            return
        if codec is not None:
            self.encoding.set_wan(codec, body["compression"])
            log.info("[%s] WAN compression: %r", self.name, codec)
        if from_upstream:
            self.van.send(sender, message.reply())
            return
        if not self.is_global:  # the local tier stays synchronous; the global servers take the settings
            futures = [self.requests.call(gs, Message(Kind.CONFIGURE, body=body)) for gs in self.upstream]
            self._when_all(futures, lambda error: self.van.send(
                sender, message.error(error) if error else message.reply()))
            return
        if optimizer is not None:
            if self.optimizer is not None:
                log.warning("[%s] replacing optimizer %s (its state is dropped)", self.name, self.optimizer.name)
            self.optimizer = optimizer
            log.info("[%s] optimizer set: %s", self.name, body["optimizer"])
            for sid, slot in self.slots.items():  # DCASGD: set after INIT, every client holds the current value
                for client in self.clients.remaining():
                    optimizer.received(sid, client, slot.value)
            restore_optimizer(self.name, self.resumed, self.optimizer)
        if policy is not None:
            self.table.policy = policy
            log.info("[%s] synchronization: %s", self.name, policy.name)
        others = [c for c in self.clients if c != sender and self.config.topology.mode is Mode.HIPS]
        if codec is None or not others:
            self.van.send(sender, message.reply())
            return
        # Every party's local server encodes its pushes: spread the setting (GeoMX's GS does the same).
        futures = [self.requests.call(c, Message(Kind.CONFIGURE, body={"compression": body["compression"]}))
                   for c in others]
        self._when_all(futures, lambda error: self.van.send(
            sender, message.error(error) if error else message.reply()))

    # -- rounds -------------------------------------------------------------------------------------------
    def _on_shutdown(self, message: Message) -> None:
        """A client leaves. In a global tier that can go on without a client (MixedSync, HFA, ESync, elastic FSA:
        see ``_may_drop``) each client leaves on its own: a fast party exits while a slow (or rejoined) one
        still trains, and later rounds no longer wait for the one that left. Elsewhere shutdown is a round that
        every client joins."""
        if not (self.is_global and self._may_drop()):
            self._contribute(message)
            return
        sender = message.sender.decode()
        all_gone = self.clients.leave(sender)
        self.van.send(sender, message.reply())
        log.info("[%s] %s left (%d of %d clients gone)", self.name, self.requests.names.get(sender, sender),
                 len(self.clients.departed), len(self.clients))
        if all_gone:
            self._done.set()
            return
        self.table.complete_ready()

    def _contribute(self, message: Message) -> None:
        self.table.contribute(message)

    # -- the round table's host ----------------------------------------------------------------------------
    @property
    def rounds(self) -> dict[RoundId, Round]:
        return self.table.rounds

    def send(self, peer: str, message: Message) -> None:
        self.route.outgoing(peer, message)
        self.van.send(peer, message)

    def push(self, message: Message) -> None:
        self._on_pushpull(message)

    def locked(self, action: Callable[[], None]) -> None:
        with self._lock:
            action()

    def redeliver(self, message: Message) -> None:
        self._handle(message)

    def display(self, client: str) -> str:
        return self.requests.names.get(client, client)

    @property
    def wan_codec(self) -> TensorCodec | None:
        return self.encoding.wan

    def answer_early(self, rnd: Round, message: Message) -> None:
        """The policy lets this contributor go on before its round completes: the last applied value, sent as
        a completed round's answer would be."""
        value = self.slots[(rnd.key, rnd.part)].value
        fields = self._reply_fields(rnd, value)
        self.send(message.sender.decode(), message.reply(**fields) if fields else message.reply(tensor=value))

    def all_done(self) -> None:
        self._done.set()

    def complete(self, rnd: Round) -> None:
        """A round is complete: reduce it as its kind says (the table set ``rnd.forwarding``)."""
        if rnd.kind is Kind.INIT:
            self.inits.complete(rnd)
        elif rnd.kind is Kind.PUSHPULL:
            self._complete_pushpull(rnd)
        elif rnd.kind in self.completions:
            self.completions[rnd.kind](rnd)
        else:  # BARRIER, SHUTDOWN: rounds without data
            if self.is_global:
                self.release(rnd, None)
            else:
                targets = self.upstream if rnd.kind is Kind.SHUTDOWN else self.upstream[:1]
                futures = [self.requests.call(gs, Message(rnd.kind, round=rnd.number)) for gs in targets]
                number = rnd.number
                self._when_all(futures, lambda error: self.release(rnd, None, error, number))

    def _complete_pushpull(self, rnd: Round) -> None:
        first = next(iter(rnd.contributions.values()))
        assert rnd.accum is not None
        total, rnd.accum = rnd.accum, None
        sid = (rnd.key, rnd.part)
        dtype = self.slots[sid].value.dtype  # what init declared; sums of fp16 were kept in fp32 until now
        full_sum, total = total, self._rescaled(rnd, total)
        if rnd.early is not None and (total is not full_sum or rnd.early not in rnd.contributions
                                      or not self._answers_early()):
            # a client is missing, or the answer is no longer the plain sum (the master set an optimizer or a
            # codec since the early sum left): everyone gets the full answer; the early sum is never used
            rnd.early = None
        if not self.is_global:
            upward = total.astype(dtype, copy=False)
            sent = self.aggregation.upward(sid, total)
            if sent is None:  # a round answered inside the party (HFA's local rounds: the average model)
                self.slots[sid] = Slot(upward)
                self.release(rnd, upward)
                return
            upward = sent.astype(dtype, copy=False)
            fields: dict[str, Any] = {"tensor": upward}
            codec = self.encoding.wan_for(upward)
            if codec is not None:
                kind = cast(TensorKind, self.aggregation.push_kind)
                try:
                    fields = payload_fields(codec, upward, TensorInfo(rnd.key, rnd.part, kind, "push"))
                except CodecError as exc:
                    self.release(rnd, None, f"cannot compress key {rnd.key} slice {rnd.part}: {exc}")
                    return
            if self.route.send_up(rnd, fields):
                return
            self.forward(rnd, Message(Kind.PUSHPULL, key=rnd.key, part=rnd.part, num_parts=first.num_parts,
                                       round=rnd.number, priority=first.priority, **fields))
            return
        slot = self.slots[sid]
        previous = slot.value
        if self.optimizer is not None:
            try:
                contributor = next(iter(rnd.contributions)) if len(rnd.contributions) == 1 else ""
                gradient = self.aggregation.gradient(total)
                slot.value = self.optimizer.step(sid, slot.value, gradient, contributor).astype(dtype, copy=False)
            except Exception as exc:  # a failing optimizer must not take the server down
                log.exception("[%s] optimizer failed on key %d", self.name, rnd.key)
                self.release(rnd, None, f"optimizer {self.optimizer.name} failed: {exc}")
                return
        else:
            slot.value = self.aggregation.combine(slot.value, total).astype(dtype, copy=False)
        answer = self.aggregation.answer_fields(rnd, slot.value, previous)
        self.release(rnd, slot.value, fields=answer or self._reply_fields(rnd, slot.value))
        checkpoint_if_due(self.checkpoints, self.slots, self.table, self.optimizer)

    # -- checkpoints (global servers) ---------------------------------------------------------------------
    def _resume(self) -> bool:
        """Load the newest valid checkpoint of this shard (--resume); False (logged) if there is none."""
        self.resumed = resume(self.name, self.config.topology.checkpoint, self.config.rank or 0, self.table)
        if self.resumed is None:
            return False
        self.slots = slots_of(self.resumed)
        return True

    def _reply_fields(self, rnd: Round, value: np.ndarray) -> dict[str, Any] | None:
        """The global server's answer, compressed when a WAN codec is set (None: the plain value).

        An aggregate of gradients is additive, so residual codecs (Bi-Sparse) may sparsify it, keeping what
        they hold back for later rounds. Weights (after a server optimizer, or HFA's global model) are not:
        they travel with stateless codecs (fp16) or dense.
        """
        codec = self.encoding.wan_for(value)
        if codec is None:
            return None
        kind: TensorKind = "weights" if self.optimizer is not None or self.aggregation.answers_weights else "gradient"
        try:
            return payload_fields(codec, value, TensorInfo(rnd.key, rnd.part, kind, "pull"))
        except CodecError as exc:
            if kind != "weights":
                raise
            log.debug("[%s] key %d is sent dense: %s", self.name, rnd.key, exc)
            return None

    def forward(self, rnd: Round, message: Message) -> None:
        """Send this round's reduction to the owning global server; release the round with its answer."""
        owner = self.owner(rnd.key, rnd.part)
        future = self.requests.call(owner, message)
        number = rnd.number
        if message.kind is Kind.PUSHPULL and message.tensor is not None and message.encoded is None:
            # plain sums: if the global server sends the others' sum early, answer with it plus ours at once
            self.early_answers.forwarded(owner, rnd.key, rnd.part, message.tensor,
                                         lambda value: self._answer_early(rnd, number, value))

        def done(result: Future[Message]) -> None:
            with self._lock:
                error = result.exception()
                if error is not None:
                    self.release(rnd, None, str(error), number)
                    return
                reply = result.result()
                self.route.answer_arrived(reply)
                if self.route.answered_elsewhere(reply):
                    return
                try:
                    if self.early_answers.settled(owner, reply):
                        return  # answered already, with the early sum (geomx.core.early)
                except ValueError as exc:
                    self._stop_fatally(f"{self.name}: {exc}")
                    return
                try:
                    reply.tensor = decode_message(self.codecs, reply)
                except CodecError as exc:
                    self.release(rnd, None, f"undecodable answer from the global server: {exc}", number)
                    return
                problem = self.aggregation.answered((rnd.key, rnd.part), reply)
                if problem:
                    self.release(rnd, None, problem, number)
                    return
                if reply.tensor is not None and rnd.number == number and rnd.forwarding:
                    self.slots[(rnd.key, rnd.part)] = Slot(reply.tensor)
                    self.aggregation.adopted((rnd.key, rnd.part), reply.tensor)
                self.release(rnd, reply.tensor, None, number)

        future.add_done_callback(done)

    def _answer_early(self, rnd: Round, number: int, value: np.ndarray) -> None:
        """Round ``number`` of ``rnd`` is the others' sum plus ours: adopt it and answer the workers now (in the
        declared dtype, as the global server stores it: half precision is summed in float32, then cast back)."""
        value = value.astype(self.slots[(rnd.key, rnd.part)].value.dtype, copy=False)
        if rnd.number == number and rnd.forwarding:
            self.slots[(rnd.key, rnd.part)] = Slot(value)
            self.aggregation.adopted((rnd.key, rnd.part), value)
        self.release(rnd, value, None, number)

    def _when_all(self, futures: list[Future[Message]], then: Callable[[str | None], None]) -> None:
        """Call ``then(error_text_or_None)`` once every future is done (under the server lock)."""
        remaining = [len(futures)]

        def one_done(_: Future[Message]) -> None:
            with self._lock:
                remaining[0] -= 1
                if remaining[0]:
                    return
                errors = [str(f.exception()) for f in futures if f.exception() is not None]
                then("; ".join(errors) if errors else None)

        if not futures:
            then(None)
        for future in futures:
            future.add_done_callback(one_done)

    def release(self, rnd: Round, value: np.ndarray | None, error: str | None = None,
                 number: int | None = None, body: dict[str, Any] | None = None,
                 fields: dict[str, Any] | None = None) -> None:
        """Answer every contributor of ``rnd`` (with ``value`` or ``error``), then start the next round.

        ``number``: release only if the round is still that one (a late answer to a round that already
        failed by timeout is dropped).
        """
        if not self.table.is_current(rnd, number):
            return
        if value is not None and not error and self.route.send_down(rnd, value):
            return
        lan_fp16 = None if self.is_global or rnd.kind is not Kind.PUSHPULL or value is None else \
            self.encoding.lan_for(value)
        if lan_fp16 is not None and not error and fields is None:
            assert value is not None
            try:  # the fp16 switch: a local server answers its workers in float16
                fields = payload_fields(lan_fp16, value, TensorInfo(rnd.key, rnd.part, "weights", "pull"))
            except CodecError as exc:
                error = f"cannot send key {rnd.key} slice {rnd.part} as fp16: {exc}"
        self.table.release(rnd, value, error, body=body, fields=fields)

    def call(self, peer: str, message: Message, then: Callable[[Future[Message]], None]) -> None:
        future = self.requests.call(peer, message)

        def done(result: Future[Message]) -> None:
            with self._lock:
                then(result)

        future.add_done_callback(done)

    def _watchdog(self) -> None:
        """Fail rounds that wait longer than the configured timeout, naming who is missing."""
        while not self._stop_watchdog.wait(0.5):
            with self._lock:
                self.table.expire(self.timeouts.round_s, self.timeouts.request_s)
