"""The parameter server process: a party's local server, or a global server of the central party.

Both run the same round machinery per (key, slice) (``geomx.core.rounds``): collect the clients'
contributions, reduce them (servers **sum**), and release the result to every contributor in one reply (push
and pull fused). A local server's reduction goes one tier up as a single request to the owning global server
(``upstream``), and the global server's answer comes back down; a global server applies its optimizer (if one
is set) to the sum and answers with the new weights, or answers with the sum itself (``pushpull``).

This module is the process: it composes the plug-ins (``geomx.server.compose``), joins the job, dispatches every
message to the part that handles its kind, and is the host the round table and the plug-ins call back. It
names no algorithm.

Every message is validated; a bad one gets an ERROR reply naming the problem, and the server goes on.
Every round has a deadline; a round that misses it fails with the names of the clients it waited for.

Usage (what ``python -m geomx.node`` does for a server role)::

    ParameterServer(node_config).run()      # returns the process exit code
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import numpy as np

from ..cluster.heartbeat import pulse_for
from ..cluster.membership import GLOBAL_SCHEDULER_ID, Tier, is_not_scheduler, join, local_scheduler_id, new_node_id
from ..codecs import Codec, CodecError, TensorInfo, default_registry
from ..codecs.base import Direction, TensorKind
from ..codecs.messages import decode_message, payload_fields
from ..config import Mode, NodeConfig, Role, plan_settings
from ..core.checkpoints import restore_optimizer, resume, values_of
from ..core.clients import Clients, collective_client
from ..core.early import EarlyAnswers
from ..core.inits import Inits
from ..core.rounds import Round, RoundTable, SliceValue
from ..optim import Optimizer
from ..protocol.bodies import ShutdownNotice, encode_body
from ..protocol.wire import Kind, Message, MessageKind, SliceId
from ..runs.checkpoint import CheckpointWriter, Snapshot
from ..runs.runlog import StatsFile
from ..transport.rpc import Requests
from ..transport.trace import Tracer
from ..transport.van import Van
from .bundles import Bundles
from .compose import compose
from .configure import Configure, build_optimizer
from .departures import Departures
from .pushpull import PushPulls
from .upstream import Upstream

log = logging.getLogger("geomx.server")


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
        self.stored: dict[SliceId, SliceValue] = {}
        self.clients = Clients()
        # The algorithms, chosen once from the config (geomx.server.compose): rounds of pushes follow the sync policy
        # (the master may set another on the global servers; local servers stay synchronous) and INIT, BARRIER
        # and SHUTDOWN rounds always wait for every client; the route carries values between tiers; the
        # aggregation says what a tier does with a sum; extensions add request kinds of an algorithm's own;
        # the codec slot says what values are encoded with (geomx.core.encoding).
        plugins = compose(config, self)
        self.table = RoundTable(self, self.clients, plugins.policy, rule=plugins.aggregation.round_rule())
        self.route = plugins.route
        self.aggregation = plugins.aggregation
        self.extensions = plugins.extensions
        self.encoding = plugins.encoding
        self.completions = plugins.completions()
        # the kinds whose requests become rounds: a rejoiner's are held until the others' cycle ends
        self.round_kinds = {Kind.PUSHPULL, Kind.BARRIER, *self.completions}
        self.early_answers = EarlyAnswers()  # a local server's early answers (geomx.core.early)
        self.configurers: set[str] = set()  # clients allowed to set the optimizer (the master worker's path)
        self.upstream: list[str] = []
        self.inits = Inits(self, self.is_global)  # INIT requests and rounds, the slices' shards
        self.upstream_addresses: dict[str, str] = {}  # the global servers' addresses (a local server's)
        self.peers: set[str] = set()  # a local server's fellow local servers
        self.lock = threading.RLock()
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
        # the parts, one per kind of event (each reaches the others through this host)
        self.departures = Departures(self)
        self.pushpulls = PushPulls(self)
        self.upstream_link = Upstream(self, held=self.pushpulls.on_held_pull)
        self.bundles = Bundles(self._handle, lambda peer, message: self.van.send(peer, message))
        self.handlers: dict[MessageKind, Callable[[Message], None]] = {
            Kind.INIT: self.inits.request, Kind.PUSHPULL: self.pushpulls.on_pushpull,
            Kind.PULL: self.upstream_link.on_pull, Kind.BARRIER: self.table.contribute,
            Kind.BUNDLE: self.bundles.on_bundle,
            Kind.SHUTDOWN: self.pushpulls.on_shutdown, Kind.CONFIGURE: Configure(self).on_configure,
            **plugins.requests(),
        }
        # before any client check: the route checks who may send its kinds; STATS and MEMBERS check their own
        self.unchecked = {Kind.STATS: self.upstream_link.on_stats, **self.route.handlers(),
                          Kind.MEMBERS: self.departures.on_members}

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
                for party in cfg.topology.collective_parties:  # its ranks are one client, each owning slices
                    ranks = global_book.of_role(Role.WORKER, party)
                    client = collective_client(party)
                    self.clients.group(client, party, [m.id for m in ranks])
                    self.requests.names[client] = client
                    self.configurers |= {m.id for m in ranks if m.master}
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

    def _resume(self) -> bool:
        """Load the newest valid checkpoint of this shard (--resume); False (logged) if there is none."""
        self.resumed = resume(self.name, self.config.topology.checkpoint, self.config.rank or 0, self.table,
                              plan_settings(self.config.topology), self.config.topology.num_global_servers)
        if self.resumed is None:
            return False
        self.stored = values_of(self.resumed)
        if self.resumed.optimizer_spec is not None:
            # the checkpoint's optimizer answers from the first round on: the master's CONFIGURE may arrive
            # after another party's first push (INIT is answered at once from the checkpoint), and a round
            # must not start as a plain sum (early answers, geomx.core.early) and end as an optimizer step
            self.optimizer = build_optimizer(self.resumed.optimizer_spec)
            restore_optimizer(self.name, self.resumed, self.optimizer)
        return True

    def run(self) -> int:
        """Serve until every client has shut down. Returns the process exit code."""
        if self.config.resume and self.is_global and not self._resume():
            return 2
        self.van.start()
        schedulers = self._join()
        # the counters as they go (RUN/stats/NAME.json, rewritten every second), and once more as the server stops,
        # however it stops (Ctrl-C, SIGTERM: geomx.node): a job stopped mid-run still reports what crossed
        counters = {"role": self.config.role.value, "party": self.config.party}
        with StatsFile(self.config.run_dir, self.name, lambda: {**counters, **self.van.counters.snapshot()}) as stats:
            return self._serve(schedulers, stats)

    def _serve(self, schedulers: list[str], stats: StatsFile) -> int:
        """``run`` once joined: serve until every client has shut down, then say goodbye."""
        self.route.start()
        spec = self.config.topology.checkpoint
        if self.is_global and spec.dir is not None:
            self.checkpoints = CheckpointWriter(spec, self.config.rank or 0, self.name,
                                                plan_settings(self.config.topology))
        log.info("[%s] serving %d clients%s", self.name, len(self.clients),
                 f", upstream {len(self.upstream)} global servers" if self.upstream else "")
        with self.lock:
            self._ready = True
            early, self._early = self._early, []
            for message in early:
                self._handle(message)
        pulse = pulse_for(self.van, self.requests, self.timeouts)
        pulse.on_dead(self.departures.member_dead)
        pulse.on_self_dead(self.departures.self_dead)
        watchdog = threading.Thread(target=self._watchdog, name=f"{self.name}-watchdog", daemon=True)
        watchdog.start()
        # bounded: in heartbeat-long slices, giving up (fatally, naming who it waited for) once the threads that
        # would deliver a client's goodbye or notice its death have ended
        while not self._done.wait(self.timeouts.heartbeat_s):
            broken = "the watchdog" if not watchdog.is_alive() else None if self.van.running else "the transport"
            if broken is not None:
                with self.lock:
                    waiting = sorted(self.display(c) for c in self.clients.remaining())
                    self.stop_fatally(f"stopped waiting for clients {waiting} to shut down: {broken} has ended")
        self._stop_watchdog.set()
        self.route.close()
        with self.lock:
            self.route.stop(self.config.run_dir)
        if self.checkpoints is not None and not self.checkpoints.wait_idle(self.timeouts.shutdown_s):
            log.error("[%s] a checkpoint was still being written at shutdown", self.name)
        for scheduler in schedulers:  # a fatal stop is announced, so the schedulers tell everyone at once
            goodbye = encode_body(ShutdownNotice(failed=self._fatal)) or None  # a plain goodbye has no body
            self.van.send(scheduler, Message(Kind.SHUTDOWN, body=goodbye))
        self.van.flush(self.timeouts.shutdown_s)
        with self.lock:
            reports = self.table.reports()
        stats.close(answer_leads=reports["leads"], push_staleness=reports["staleness"],
                    **({"outer_rounds": reports["rounds"]} if "rounds" in reports else {}))
        self.van.stop()
        if self._fatal:
            log.error("[%s] stopped: %s", self.name, self._fatal)
            return 4
        log.info("[%s] shut down", self.name)
        return 0

    def _watchdog(self) -> None:
        """Fail rounds that wait longer than the configured timeout, naming who is missing; note this server's
        step (its least advanced slice's completed rounds) for its heartbeats' reports."""
        pulse = pulse_for(self.van, self.requests, self.timeouts)
        ruled = self.table.rule is not None  # rounds that close by time (PushPulls.close_by_time) meanwhile
        while not (self.pushpulls.close_by_time(self._stop_watchdog) if ruled else self._stop_watchdog.wait(0.5)):
            with self.lock:
                self.pushpulls.expire(self.timeouts.round_s, self.timeouts.request_s)
                rounds = [self.table.completed(Kind.PUSHPULL, *sid) for sid in self.stored]
                times = (list(self.table.times.counts), self.table.times.seconds)
                reports = self.table.reports() if self.is_global else {}
            pulse.note(step=min((r for r in rounds if r), default=0), rounds=times, leads=reports.get("leads"),
                       staleness=reports.get("staleness"), outer_rounds=reports.get("rounds", {}).get("by_party"))

    def stop_fatally(self, text: str) -> None:
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
            with self.lock:  # the others' sum, ahead of the answer to our push (geomx.core.early)
                self.early_answers.store(message.sender.decode(), message)
            return
        if message.is_reply:
            if not self.requests.resolve(message):
                log.warning("[%s] reply %d from %r answers no pending request", self.name, message.request_id,
                            message.sender)
            return
        with self.lock:
            if not self._ready:
                self._early.append(message)
                return
            self._handle(message)

    def refuse(self, message: Message, text: str) -> None:
        sender = message.sender.decode()
        log.warning("[%s] refused %s from %s: %s", self.name, message.kind.name, self.display(sender), text)
        error = message.error(f"{self.name}: {text}")
        if not self.bundles.sending(sender, error) and self.van.knows(sender):
            self.van.send(sender, error)

    def _handle(self, message: Message) -> None:
        sender = message.sender.decode()
        if self._fatal is not None:
            self.refuse(message, self._fatal)
            return
        unchecked = self.unchecked.get(message.kind)
        if unchecked is not None:
            unchecked(message)
            return
        from_upstream = message.kind is Kind.CONFIGURE and sender in self.upstream
        if not self.clients.knows(sender) and not from_upstream:
            self.refuse(message, f"{sender!r} is not a client of this server")
            return
        if message.kind in self.round_kinds and self.clients.hold(message):
            return  # replayed when the others' cycle ends (RoundTable.admit)
        client = self.clients.client_of(sender)
        refusal = self.clients.refusal(client, self.display(client))
        if refusal is not None:
            self.refuse(message, refusal)
            return
        if message.encoded is not None:
            try:
                message.tensor = decode_message(self.codecs, message)
            except CodecError as exc:
                self.refuse(message, f"undecodable payload for key {message.key} slice {message.slice}: {exc}")
                return
            message.encoded = None
        if message.kind is Kind.PUSHPULL and self.route.holds(message):
            return
        handler = self.handlers.get(message.kind)
        if handler is None:
            self.refuse(message, f"a server does not handle {message.kind.name} requests")
            return
        handler(message)

    # -- the host of the round table and the plug-ins ------------------------------------------------------
    @property
    def wan_codec(self) -> Codec | None:
        return self.encoding.wan

    def owner(self, key: int, index: int) -> str:
        """The global server that holds (key, slice), by the shard id its INIT declared."""
        return self.inits.owner(key, index)

    def tensor_info(self, key: int, index: int, kind: TensorKind, direction: Direction) -> TensorInfo:
        return self.inits.tensor_info(key, index, kind, direction)

    def display(self, client: str) -> str:
        return self.requests.display(client)

    def send(self, peer: str, message: Message) -> None:
        self.route.outgoing(peer, message)
        if not self.bundles.sending(peer, message):  # a bundle's part: answered with the bundle (server/bundles.py)
            self.van.send(peer, message)

    def push(self, message: Message) -> None:
        self.pushpulls.on_pushpull(message)

    def locked(self, action: Callable[[], None]) -> None:
        with self.lock:
            action()

    def redeliver(self, message: Message) -> None:
        self._handle(message)

    def answer_early(self, rnd: Round, message: Message) -> None:
        self.pushpulls.answer_early(rnd, message)

    def all_done(self) -> None:
        self._done.set()

    def complete(self, rnd: Round) -> None:
        """A round is complete: reduce it as its kind says (the table set ``rnd.forwarding``)."""
        if rnd.kind is Kind.INIT:
            self.inits.complete(rnd)
        elif rnd.kind is Kind.PUSHPULL:
            self.pushpulls.complete(rnd)
        elif rnd.kind in self.completions:
            self.completions[rnd.kind](rnd)
        elif self.is_global:  # BARRIER, SHUTDOWN: rounds without data
            self.release(rnd, None)
        else:
            targets = self.upstream if rnd.kind is Kind.SHUTDOWN else self.upstream[:1]
            futures = [self.requests.call(gs, Message(rnd.kind, round=rnd.number)) for gs in targets]
            number = rnd.number
            self.when_all(futures, lambda error: self.release(rnd, None, error, number))

    def forward(self, rnd: Round, message: Message) -> None:
        self.upstream_link.forward(rnd, message)

    def when_all(self, futures: list[Future[Message]], then: Callable[[str | None], None]) -> None:
        self.upstream_link.when_all(futures, then)

    def call(self, peer: str, message: Message, then: Callable[[Future[Message]], None]) -> None:
        future = self.requests.call(peer, message)

        def done(result: Future[Message]) -> None:
            with self.lock:
                then(result)

        future.add_done_callback(done)

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
        lan = None if self.is_global or rnd.kind is not Kind.PUSHPULL or value is None else \
            self.encoding.lan_for(value)
        if lan is not None and not error and fields is None:
            assert value is not None
            try:  # a local server answers its workers in the LAN's codec
                fields = payload_fields(lan, value, self.tensor_info(rnd.key, rnd.slice, "weights", "pull"))
            except CodecError as exc:
                error = f"cannot send key {rnd.key} slice {rnd.slice} as {lan.name}: {exc}"
        self.table.release(rnd, value, error, body=body, fields=fields)
