"""What the global scheduler knows about a running job, as one JSON-able snapshot (the status page's data).

Every member's heartbeats carry its report (``HeartbeatBody``: byte counters, step, busy share); the scheduler
hands each one to a ``StatusBoard`` and, when the page is asked for, the rows of its members with their state
(``waiting`` for the others to register, ``training``, ``rejoining``, ``left``, ``dead``). The board joins
the two into ``/status.json``. A party's workers beat to their party's scheduler alone: that scheduler's board
relays their records (``members``) in its heartbeat answers to the party's local server, whose next heartbeats
carry them to the global scheduler (``HeartbeatBody.party``), a heartbeat interval or two late. The HTML page
and the Prometheus metrics (``geomx.cluster.status_page``) are rendered from that same snapshot, so the three
never disagree. Workers' model digests (where every party should hold the same model) are compared across members
by a ``DigestBook`` (``geomx.cluster.digests``), which names the parties that disagree in the log. Checkpoints
are read from the folder's file names (``checkpoint.dir/gs<shard>/ckpt-<step>.json``) when the page is asked for,
never on the scheduler's loop.
The snapshot holds no secret: only the names of the algorithm, codec and tiers.

Usage::

    board = StatusBoard(topology)
    board.heard(member_id, decode_body(HeartbeatBody, message.body))       # on every heartbeat
    data = board.snapshot([MemberRow(member_id, "dc1/server", "local_server", "dc1", 0, "training")],
                          missing={}, phase="training")
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import Topology
from ..protocol.bodies import ROUND_BUCKETS_S, HeartbeatBody
from .digests import DigestBook

STATES = ("waiting", "training", "rejoining", "left", "dead")
RATE_WINDOW_S = 30.0  # a member silent for longer adds nothing to its party's rate
RELAY_MAX = 1000  # members a party scheduler relays at most (each ~300 bytes in a heartbeat answer)
_CHECKPOINT = re.compile(r"ckpt-(\d+)\.json")


@dataclass(frozen=True)
class MemberRow:
    """One member as its scheduler sees it: identity, place in the job and state (one of ``STATES``)."""

    id: str
    name: str
    role: str
    party: str
    rank: int | None
    state: str


@dataclass
class _Sample:
    at: float  # time.monotonic() when heard
    body: HeartbeatBody


def _sum(samples: list[_Sample], field: str) -> int:
    return sum(int(getattr(s.body, field)) for s in samples)


def job_summary(topology: Topology) -> dict[str, Any]:
    """The job's fixed facts for the page: algorithm, codec, tiers (never the security settings)."""
    training = topology.training
    algorithm = training.sync
    if topology.hfa is not None:
        algorithm = f"hfa (k1={topology.hfa.k1}, k2={topology.hfa.k2})"
    codec = training.compression or {}
    return {"algorithm": algorithm, "sync": training.sync, "server_optimizer": training.server_optimizer,
            "codec": str(codec.get("type", "none")), "mode": topology.mode.value, "central": topology.central,
            "global_servers": topology.num_global_servers, "parties": [p.name for p in topology.parties]}


def checkpoints(folder: Path | None, shards: int, now: float | None = None) -> dict[str, Any] | None:
    """The newest checkpoint of each global server's shard in ``folder`` (by its manifest's name and time), and
    the job's: the least advanced shard's (a resume starts from every shard's newest). None without a folder."""
    if folder is None:
        return None
    now = time.time() if now is None else now
    found = []
    for shard in range(shards):
        newest: tuple[int, float] | None = None
        try:
            entries = list((folder / f"gs{shard}").iterdir())
        except OSError:
            entries = []
        for entry in entries:
            match = _CHECKPOINT.fullmatch(entry.name)
            if match is None:
                continue
            try:
                written = entry.stat().st_mtime
            except OSError:  # removed by the writer's rotation meanwhile
                continue
            if newest is None or int(match.group(1)) > newest[0]:
                newest = (int(match.group(1)), written)
        if newest is not None:
            found.append({"shard": shard, "step": newest[0], "age_s": max(0.0, now - newest[1])})
    job = min(found, key=lambda c: c["step"]) if len(found) == shards and found else None
    return {"dir": str(folder), "shards": found, "step": job["step"] if job else None,
            "age_s": max(c["age_s"] for c in found) if job else None}


def _merged(counts: Iterable[dict[str, int] | None]) -> dict[str, int] | None:
    """Counts by a number (answers per rounds ahead, pushes per staleness), summed over a party's clients (None: no
    global server counted any)."""
    total: dict[int, int] = {}
    for entry in counts:
        for ahead, count in (entry or {}).items():
            total[int(ahead)] = total.get(int(ahead), 0) + count
    return {str(k): v for k, v in sorted(total.items())} or None


def _rounds(body: HeartbeatBody) -> dict[str, Any] | None:
    """A server's round durations: counts per bucket (``le``: each bucket's upper bound, the last unbounded) and
    their sum; None where the member counts none (or a count of another bucket layout)."""
    counts = body.round_counts
    if counts is None or len(counts) != len(ROUND_BUCKETS_S) + 1 or body.round_seconds is None:
        return None
    return {"le": list(ROUND_BUCKETS_S), "counts": list(counts), "count": sum(counts),
            "seconds": round(body.round_seconds, 6)}


def _relay_record(name: str, party: str, record: dict[str, Any]) -> dict[str, Any] | None:
    """A relayed member record with the keys and types a local record has (None for one that is not)."""
    def number(key: str) -> float | None:
        value = record.get(key)
        return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    def counts(key: str, names: tuple[str, str] = ("sent", "recv")) -> dict[str, int]:
        value = record.get(key)
        found = value if isinstance(value, dict) else {}
        return {d: int(v) if isinstance(v := found.get(d), int) else 0 for d in names}

    state, role = record.get("state"), record.get("role")
    if state not in STATES or not isinstance(role, str):
        return None
    step, rank = number("step"), number("rank")
    models = record.get("models")
    return {"id": str(record.get("id", name)), "name": name, "role": role, "party": party,
            "rank": int(rank) if rank is not None else None, "state": state,
            "heartbeat_age_s": number("heartbeat_age_s"), "step": int(step) if step is not None else None,
            "busy": number("busy"), "wan_bytes": counts("wan_bytes"), "lan_bytes": counts("lan_bytes"),
            "saved_bytes": counts("saved_bytes", ("lan", "wan")), "rounds": None,
            "models": {k: v for k, v in models.items() if isinstance(v, str)} if isinstance(models, dict) else None}


def _party_names(topology: Topology, rows: list[MemberRow]) -> list[str]:
    """The topology's parties in its order, then any other party a member names (a job started from DMLC_*
    counts alone knows only placeholders for the parties)."""
    names = [p.name for p in topology.parties] if topology.parties_known else []
    return names + sorted({row.party for row in rows} - set(names))


class StatusBoard:
    """The members' latest reports, and the snapshot the status page serves. Thread-safe: heartbeats arrive on the
    scheduler's I/O thread, snapshots are asked for on the HTTP server's threads. See the module docstring."""

    def __init__(self, topology: Topology, clock: Any = time.monotonic, owner: str = "scheduler") -> None:
        self._topology = topology
        self._clock = clock
        self._started = clock()
        self._lock = threading.Lock()
        self._latest: dict[str, _Sample] = {}
        self._previous: dict[str, _Sample] = {}
        self._party: dict[str, str] = {}  # member id -> party, for every member ever heard (its bytes still count)
        self._since: dict[str, float] = {}  # member id -> when it was first seen (its age before any heartbeat)
        self.job = job_summary(topology)
        self.digests = DigestBook(owner)  # the workers' model digests, compared across members
        self._renumbered: set[str] = set()  # parties restarted into the running job: steps counted from the restart

    def model_digests(self) -> dict[str, Any]:
        """The parties' model digests compared (``DigestBook.summary``), for the scheduler's stats file."""
        with self._lock:
            return self.digests.summary()

    def seen(self, member_id: str, party: str) -> None:
        """``member_id`` registered now (a heartbeat age counts from here until its first heartbeat)."""
        with self._lock:
            self._since.setdefault(member_id, self._clock())
            self._party[member_id] = party

    def rejoined(self, party: str) -> None:
        """``party`` was restarted into the running job: its workers count their steps from their restart, not from
        the job's start, so the steps their model digests name are not the others' and are no longer compared
        (before, a rejoined party's first digests were compared with the job's first steps and named as a
        disagreement)."""
        with self._lock:
            self._renumbered.add(party)
            self.digests.forget(party)

    def heard(self, member_id: str, body: HeartbeatBody, party: str | None = None, name: str | None = None) -> None:
        """A heartbeat with its report (counters are cumulative: the newest replaces the older); ``name``: the
        member's, for its model digests."""
        with self._lock:
            if member_id in self._latest:
                self._previous[member_id] = self._latest[member_id]
            self._latest[member_id] = _Sample(self._clock(), body)
            if party is not None:
                self._party[member_id] = party
            where = self._party.get(member_id, "")
            if where in self._renumbered:
                return
            if body.models:
                self.digests.add(where, name or member_id, body.models)
            for who, record in (body.party or {}).items():  # a party's workers, relayed
                if isinstance(record, dict) and isinstance(record.get("models"), dict):
                    self.digests.add(where, who, record["models"])

    def _rate(self, member_id: str, field: str, now: float) -> float:
        latest, previous = self._latest.get(member_id), self._previous.get(member_id)
        if latest is None or previous is None or now - latest.at > RATE_WINDOW_S or latest.at <= previous.at:
            return 0.0
        return max(0.0, (getattr(latest.body, field) - getattr(previous.body, field)) / (latest.at - previous.at))

    def _member(self, row: MemberRow, now: float) -> dict[str, Any]:
        sample = self._latest.get(row.id)
        heard = sample.at if sample is not None else self._since.get(row.id)
        body = sample.body if sample is not None else HeartbeatBody()
        return {"id": row.id, "name": row.name, "role": row.role, "party": row.party, "rank": row.rank,
                "state": row.state, "heartbeat_age_s": None if heard is None else round(now - heard, 3),
                "step": body.step, "busy": body.busy,
                "wan_bytes": {"sent": body.wan_sent, "recv": body.wan_recv},
                "lan_bytes": {"sent": body.lan_sent, "recv": body.lan_recv},
                "saved_bytes": {"lan": body.lan_saved, "wan": body.wan_saved}, "rounds": _rounds(body),
                "models": body.models}

    def members(self, rows: list[MemberRow]) -> dict[str, dict[str, Any]]:
        """Name -> record of each of ``rows`` (a party scheduler's relay of its members, up to ``RELAY_MAX``)."""
        now = self._clock()
        with self._lock:
            return {row.name: self._member(row, now) for row in rows[:RELAY_MAX]}

    def _relayed(self, name: str, now: float) -> list[dict[str, Any]]:
        """The members of party ``name`` that its servers relay (its workers, as its own scheduler sees them), each
        heartbeat age grown by the time since the relay arrived."""
        found = []
        for member, party in self._party.items():
            sample = self._latest.get(member)
            if party != name or sample is None or not sample.body.party:
                continue
            for who, record in sorted(sample.body.party.items()):
                entry = _relay_record(who, name, record)
                if entry is not None:
                    age = entry["heartbeat_age_s"]
                    entry["heartbeat_age_s"] = None if age is None else round(age + now - sample.at, 3)
                    found.append(entry)
        return found

    def _by_client(self, field: str) -> dict[str, dict[int, int]]:
        """Client name -> {number: count}, summed over the global servers' reports of ``field`` (``leads``: answers
        by rounds ahead; ``push_staleness``: pushes by staleness)."""
        total: dict[str, dict[int, int]] = {}
        for sample in self._latest.values():
            for client, counts in (getattr(sample.body, field) or {}).items():
                entry = total.setdefault(client, {})
                for ahead, count in counts.items():
                    if ahead.isdigit():
                        entry[int(ahead)] = entry.get(int(ahead), 0) + count
        return total

    def _outer_rounds(self) -> dict[str, dict[str, int]]:
        """Client name -> {status: rounds}, summed over the global servers' decoupled rounds (``outer_rounds``)."""
        total: dict[str, dict[str, int]] = {}
        for sample in self._latest.values():
            for client, counts in (sample.body.outer_rounds or {}).items():
                entry = total.setdefault(client, {})
                for status, count in counts.items():
                    entry[status] = entry.get(status, 0) + count
        return total

    def snapshot(self, rows: list[MemberRow], missing: dict[str, int], phase: str) -> dict[str, Any]:
        """``/status.json``: the job, each party with its members (``rows``, in order, then the ones its servers
        relay) and traffic, checkpoints."""
        now = self._clock()
        topology = self._topology
        with self._lock:
            members = [self._member(row, now) for row in rows]
            known = {m["name"] for m in members}
            members += [m for name in _party_names(topology, rows) for m in self._relayed(name, now)
                        if m["name"] not in known]
            # how far ahead of its round each answer let a client run (SSP's staleness); how many updates of its
            # slice each push missed (MixedSync's); each member's newest model digest
            for field, report in (("answers_ahead", self._by_client("leads")),
                                  ("push_staleness", self._by_client("push_staleness"))):
                for m in members:
                    m[field] = {str(k): v for k, v in sorted(report[m["name"]].items())} \
                        if m["name"] in report else None
            outer = self._outer_rounds()  # decoupled rounds: on time, missed, folded in late, dropped
            for m in members:
                m["outer_rounds"] = outer.get(m["name"])
                m["model"] = self.digests.latest(m["party"], m["name"]) or self.digests.latest(m["party"], m["id"])
                del m["models"]
            model = self.digests.summary()
            parties = []
            for name in _party_names(topology, rows):
                spec = next((p for p in topology.parties if p.name == name), None) if topology.parties_known else None
                ids = [m for m, party in self._party.items() if party == name]
                samples = [self._latest[m] for m in ids if m in self._latest]
                # a party's step: its slowest worker's, where workers say (the wrapper), else its servers' rounds
                live = [m for m in members if m["party"] == name and m["step"] is not None
                        and m["role"] != "global_server" and m["state"] in ("training", "waiting")]
                steps = [m["step"] for m in live if m["role"] == "worker"] or [m["step"] for m in live]
                parties.append({
                    "name": name, "central": name == topology.central,
                    "lan": spec.lan.value if spec else None, "workers": spec.num_workers if spec else None,
                    "step": min(steps) if steps else None,
                    "wan_bytes": {"sent": _sum(samples, "wan_sent"), "recv": _sum(samples, "wan_recv")},
                    "lan_bytes": {"sent": _sum(samples, "lan_sent"), "recv": _sum(samples, "lan_recv")},
                    # the party's servers' own, and its workers' LAN savings as its servers relay them
                    "codec_saved_bytes": {"wan": _sum(samples, "wan_saved"), "lan": _sum(samples, "lan_saved") + sum(
                        m["saved_bytes"]["lan"] for m in members if m["party"] == name and m["name"] not in known)},
                    "wan_rate_bps": {d: round(8 * sum(self._rate(m, f"wan_{d}", now) for m in ids), 1)
                                     for d in ("sent", "recv")},
                    "answers_ahead": _merged(m["answers_ahead"] for m in members if m["party"] == name),
                    "push_staleness": _merged(m["push_staleness"] for m in members if m["party"] == name),
                    # decoupled rounds, the party's (a collective party's client, dc1/ranks, is no member's row)
                    "outer_rounds": _party_counts(outer, name),
                    "members": [m for m in members if m["party"] == name]})
        rounds = [m["step"] for m in members if m["role"] == "global_server" and m["step"] is not None]
        return {"job": {**self.job, "phase": phase, "uptime_s": round(now - self._started, 3),
                        "global_round": min(rounds) if rounds else None, "model": model},
                "parties": parties, "missing": dict(missing),
                "checkpoint": checkpoints(topology.checkpoint.dir, topology.num_global_servers)}


def _party_counts(outer: dict[str, dict[str, int]], party: str) -> dict[str, int] | None:
    """The decoupled rounds' counts of ``party``'s clients (named ``party/...``), summed; None: it has none."""
    found = [counts for client, counts in outer.items() if client.split("/", 1)[0] == party]
    if not found:
        return None
    return {status: sum(counts.get(status, 0) for counts in found) for status in sorted({k for c in found for k in c})}
