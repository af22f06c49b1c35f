"""Failure detection: every node tells its scheduler(s) it is alive; schedulers name the silent ones.

Two halves, both small:

* ``Pulse`` (every node that registered): sends ``HEARTBEAT`` to each of its schedulers every
  ``timeouts.heartbeat_interval_s``. Each answer carries the scheduler's list of dead members. When one
  appears, the node logs it, fails every request it has outstanding to that member (so nobody waits for a
  dead peer until a long request timeout) and tells its listeners (a server fails the rounds that wait for
  it). When the node itself is on that list, or a scheduler stops answering for ``timeouts.heartbeat_s``
  (its party is down, or this one is cut off: the scheduler declares this node dead by then anyway), the
  node stops: every request fails naming why, and its ``on_self_dead`` listeners stop the server.
  Each heartbeat carries the node's report (``HeartbeatBody``: its byte counters, and the step and busy share
  its owner ``note``-s), which the global scheduler serves on its status page (``geomx.cluster.status``).
* ``Watch`` (schedulers): remembers when each member was last heard from; a member silent for
  ``timeouts.heartbeat_s`` (and that did not say goodbye) is declared dead, logged, and listed in every
  heartbeat answer from then on.

Heartbeats are handled on the van's I/O thread (``Van.heartbeat_hook``) and sent at the highest priority,
so neither a busy handler nor a queue of tensors on an emulated WAN delays them. A message already on an
emulated link is not interrupted, though: keep ``heartbeat_s`` above the time one slice takes to cross the
slowest link.

Usage::

    pulse = pulse_for(van, requests)             # what membership.register does for every node
    pulse.watch("dc1/scheduler", names={...})
    pulse.on_dead(lambda member_id, why: ...)    # servers: fail the rounds that wait for it
    pulse.note(step=120, busy=0.8)               # travels with the next heartbeats
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from ..config import Timeouts
from ..protocol.bodies import HeartbeatBody, encode_body
from ..protocol.wire import Kind, Message
from ..transport.rpc import Requests
from ..transport.van import Van

log = logging.getLogger("geomx.cluster.heartbeat")

PRIORITY = 2**31 - 1  # jumps every queue in the emulated links
DeadListener = Callable[[str, str], None]


class Pulse:
    """A node's heartbeats to its schedulers, and what it learns from their answers. See the module docstring."""

    def __init__(self, van: Van, requests: Requests, timeouts: Timeouts) -> None:
        self._van = van
        self._requests = requests
        self._interval = timeouts.heartbeat_interval_s
        self._timeout = timeouts.heartbeat_s
        self._lock = threading.Lock()
        self._targets: dict[str, float] = {}  # scheduler id -> when it last answered
        self._dead: dict[str, str] = {}  # member id -> why, as announced
        self._new_dead: list[tuple[str, str]] = []
        self._listeners: list[DeadListener] = []
        self._self_listeners: list[Callable[[str], None]] = []
        self._stopped_self = False
        self._notes: dict[str, int | float] = {}  # step, busy: what the node's owner last noted
        self._party: dict[str, dict[str, Any]] = {}  # a local server: its party's members, from its scheduler
        self._party_from: str | None = None  # ... that scheduler (never sent back to it)
        self._rounds: tuple[list[int], float] | None = None  # a server: its rounds' durations (counts, sum)
        self._leads: dict[str, dict[str, int]] = {}  # a server: its answers per client, by rounds ahead
        self._staleness: dict[str, dict[str, int]] = {}  # a global server: its pushes per client, by staleness
        self._outer_rounds: dict[str, dict[str, int]] = {}  # a global server: its decoupled rounds per client
        self._models: dict[str, str] = {}  # a worker: its model's digests at its last digested steps
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{van.name}-heartbeat", daemon=True)

    def watch(self, scheduler_id: str) -> None:
        """Start sending heartbeats to ``scheduler_id`` (a peer of the van already)."""
        with self._lock:
            self._targets[scheduler_id] = time.monotonic()
        if not self._thread.is_alive() and not self._stop.is_set():
            self._thread.start()
        self._beat(scheduler_id)

    def on_dead(self, listener: DeadListener) -> None:
        """Call ``listener(member_id, why)`` (on the heartbeat thread) for every member declared dead."""
        with self._lock:
            self._listeners.append(listener)
            known = list(self._dead.items())
        for member, why in known:
            listener(member, why)

    def on_self_dead(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(text)`` (on the heartbeat thread) if a scheduler declares *this* node dead: it was cut
        off or frozen for longer than the heartbeat timeout, and its peers have dropped it or stopped."""
        with self._lock:
            self._self_listeners.append(listener)

    def note(self, *, step: int | None = None, busy: float | None = None,
             rounds: tuple[list[int], float] | None = None, leads: dict[str, dict[str, int]] | None = None,
             staleness: dict[str, dict[str, int]] | None = None, models: dict[str, str] | None = None,
             outer_rounds: dict[str, dict[str, int]] | None = None) -> None:
        """What the next heartbeats report besides the byte counters (any thread; cheap: a dict update).
        ``rounds``: a server's round durations (``geomx.core.round_times.RoundTimes``: counts per bucket, their sum);
        ``leads``, ``staleness``: its answers per client by rounds ahead, its pushes per client by staleness
        (``RoundTable.reports``); ``models``: a worker's model digests by step (``geomx.torch.digest``);
        ``outer_rounds``: a global server's decoupled rounds per client, by status."""
        if step is not None:
            self._notes["step"] = int(step)
        if busy is not None:
            self._notes["busy"] = min(1.0, max(0.0, float(busy)))
        if rounds is not None:
            self._rounds = (list(rounds[0]), float(rounds[1]))
        if leads is not None:
            self._leads = leads
        if staleness is not None:
            self._staleness = staleness
        if models is not None:
            self._models = dict(models)
        if outer_rounds is not None:
            self._outer_rounds = outer_rounds

    def models(self) -> dict[str, str]:
        """The model digests noted last (step -> digest): what the next heartbeats carry."""
        return dict(self._models or {})

    def report(self, to: str | None = None) -> HeartbeatBody:
        """This node's report, as its next heartbeat to scheduler ``to`` carries it (the party relay goes to every
        scheduler but the one it came from)."""
        counts, saved = self._van.counters.snapshot(), self._van.counters.saved_bytes()
        notes, rounds = dict(self._notes), self._rounds
        step, busy = notes.get("step"), notes.get("busy")
        return HeartbeatBody(lan_sent=int(counts["lan"]["sent"]), lan_recv=int(counts["lan"]["recv"]),
                             wan_sent=int(counts["wan"]["sent"]), wan_recv=int(counts["wan"]["recv"]),
                             step=int(step) if step is not None else None,
                             busy=float(busy) if busy is not None else None,
                             party=(self._party or None) if to != self._party_from else None,
                             round_counts=rounds[0] if rounds else None, round_seconds=rounds[1] if rounds else None,
                             leads=self._leads or None, lan_saved=saved["lan"], wan_saved=saved["wan"],
                             push_staleness=self._staleness or None, models=self._models or None,
                             outer_rounds=self._outer_rounds or None)

    def dead(self) -> dict[str, str]:
        with self._lock:
            return dict(self._dead)

    def stop(self) -> None:
        self._stop.set()

    def __call__(self, message: Message) -> bool:
        """The van's heartbeat hook (I/O thread): consume answers from our schedulers, nothing else."""
        sender = message.sender.decode(errors="replace")
        if not message.is_reply or sender not in self._targets:
            return False
        dead = (message.body or {}).get("dead", {})
        party = (message.body or {}).get("party")
        if isinstance(party, dict):  # a party scheduler's view of its members, relayed to the global scheduler
            self._party, self._party_from = party, sender
        with self._lock:
            self._targets[sender] = time.monotonic()
            if isinstance(dead, dict):
                for member, why in dead.items():
                    if isinstance(member, str) and member not in self._dead:
                        self._dead[member] = str(why)
                        self._new_dead.append((member, str(why)))
        return True

    def _beat(self, scheduler_id: str) -> None:
        body = encode_body(self.report(scheduler_id))
        self._van.send(scheduler_id, Message(Kind.HEARTBEAT, priority=PRIORITY, body=body))

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            now = time.monotonic()
            with self._lock:
                targets = dict(self._targets)
                new_dead, self._new_dead = self._new_dead, []
                listeners = list(self._listeners)
            for scheduler_id, last in targets.items():
                self._beat(scheduler_id)
                silent = now - last
                name = self._requests.names.get(scheduler_id, scheduler_id)
                if silent > self._timeout:  # its side of the same silence declares this node dead by now
                    self._stop_self(f"{name} has not answered heartbeats for {silent:.1f} s (limit "
                                    f"{self._timeout:g} s): its data center is down or this one is cut off; "
                                    f"{self._van.name} stops; restart its party to rejoin")
            for member, why in new_dead:
                if member == self._van.identity:
                    self._stop_self(f"{self._van.name} was declared dead ({why}) and dropped from the job; "
                                    "restart its party to rejoin (MixedSync, HFA and ESync take a restarted "
                                    "party back)")
                else:
                    self._declare(member, why, listeners)

    def _stop_self(self, text: str) -> None:
        """This node is out of the job (declared dead, or its scheduler is gone): nothing it sends would be
        accepted again, so every request fails with ``text`` and the listeners stop the node. Once."""
        if self._stopped_self:
            return
        self._stopped_self = True
        log.error("[%s] %s", self._van.name, text)
        self._requests.fail_everything(text)
        with self._lock:
            listeners = list(self._self_listeners)
        for listener in listeners:
            try:
                listener(text)
            except Exception:  # a listener bug must not stop the heartbeats
                log.exception("[%s] handler for this node's own death failed", self._van.name)

    def _declare(self, member: str, why: str, listeners: Iterable[DeadListener]) -> None:
        name = self._requests.names.get(member)
        if name is None:  # a member this node never knew (e.g. replaced by a rejoined one before we joined)
            log.info("[%s] former member %s is dead: %s", self._van.name, member, why)
            return
        log.error("[%s] %s is dead: %s", self._van.name, name, why)
        self._requests.fail_peer(member, f"{name} is dead: {why}")
        for listener in listeners:
            try:
                listener(member, why)
            except Exception:  # a listener bug must not stop the heartbeats
                log.exception("[%s] failure handler for %s failed", self._van.name, name)


def pulse_for(van: Van, requests: Requests, timeouts: Timeouts) -> Pulse:
    """The van's Pulse, made and hooked in on first use (one per node; it stops with the van)."""
    hook = van.heartbeat_hook
    if isinstance(hook, Pulse):
        return hook
    pulse = Pulse(van, requests, timeouts)
    van.heartbeat_hook = pulse
    van.on_stop(pulse.stop)
    return pulse


class Watch:
    """A scheduler's view of its members' heartbeats. See the module docstring.

    Usage::

        watch = Watch(timeouts, names={member_id: "dc1/worker0", ...}, owner="dc1/scheduler")
        watch.heard(member_id)                    # on every heartbeat (and at registration)
        for member_id, why in watch.check(gone=goodbyes): ...   # newly dead members
    """

    def __init__(self, timeouts: Timeouts, names: dict[str, str], owner: str) -> None:
        self._timeout = timeouts.heartbeat_s
        self.names = names
        self._owner = owner
        self._lock = threading.Lock()
        now = time.monotonic()
        self._last: dict[str, float] = dict.fromkeys(names, now)
        self.dead: dict[str, str] = {}

    def heard(self, member: str) -> bool:
        """Record a heartbeat; False if ``member`` is not one of ours."""
        with self._lock:
            if member not in self._last:
                return False
            self._last[member] = time.monotonic()
            return True

    def add(self, member: str, name: str) -> None:
        """Watch a member that joined later (a restarted party's server), from now on."""
        with self._lock:
            self.names[member] = name
            self._last[member] = time.monotonic()

    def check(self, gone: Iterable[str]) -> list[tuple[str, str]]:
        """Declare dead every member silent too long that did not leave; returns the new ones."""
        now = time.monotonic()
        left = set(gone)
        found = []
        with self._lock:
            for member, last in self._last.items():
                if member in left or member in self.dead or now - last <= self._timeout:
                    continue
                why = f"no heartbeat for {now - last:.1f} s (limit {self._timeout:g} s), declared by {self._owner}"
                self.dead[member] = why
                found.append((member, why))
        return found

    def declare(self, member: str, why: str) -> None:
        """Mark ``member`` dead for a reason other than silence (it left after a fatal error)."""
        with self._lock:
            if member in self._last:
                self.dead.setdefault(member, why)

    def snapshot(self) -> dict[str, str]:
        with self._lock:
            return dict(self.dead)
