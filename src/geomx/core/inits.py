"""INIT: a key's first value, and which global server (shard) holds each (key, slice).

Every client sends INIT for every (key, slice) it will push, naming the shard it placed it on (see
``geomx.core.sharding``); exactly one of them (the master worker) carries the value. A global server keeps that
value as the slice's first weights and answers every client with it; a local server checks its workers'
INITs and sends one INIT up to the owning global server. A client that INITs a slice that already has a
value (a late joiner, a rejoined party) gets the current value at once, and counts as having seen the slice's
rounds released so far (a round rule's lateness and a push's staleness count from there, not from the job's
start). An INIT also says how many elements the whole tensor has: codecs gate on that, not on the slice
(``tensor_info``).

Usage (inside a server, under its lock)::

    inits = Inits(server, is_global=False)
    inits.shard_owner = {0: "gs0-id"}
    inits.request(init_message)            # checked; joins its INIT round
    inits.complete(rnd)                    # the round is complete: keep the value, or send it up
"""

from __future__ import annotations

import hashlib
import math
from typing import Any, Protocol

import numpy as np

from ..codecs.base import Direction, TensorInfo, TensorKind
from ..protocol.bodies import BodyError, InitBody, decode_body
from ..protocol.wire import Kind, Message, SliceId
from .rounds import SAME, Round, RoundTable, SliceValue

# body key of a late joiner's INIT answer: the job's model moved since its global servers started (``rounds_released``)
MOVED = "moved"


def value_digest(value: np.ndarray) -> str:
    """The digest of a value's bytes (SHA-256, its first 128 bits): what an INIT without the value says it holds,
    so a party that starts from the master's weights (the same seed) is not sent them over the WAN again. SHA-256
    because CPUs hash it in hardware (x86's SHA extensions, ARMv8's): a restarted party's ranks digest the whole
    model before their INIT (0.49 s for 170 MB on this project's loaded host, against 1.0-1.5 s for BLAKE2b)."""
    return hashlib.sha256(np.ascontiguousarray(value).data).hexdigest()[:32]


def rounds_released(table: RoundTable) -> bool:
    """Whether ``table`` released a round of pushes since its server started (or resumed): then a late joiner's own
    model (a restarted party's seed) matches the job's only by chance, so its digest is not compared (170 MB of
    SHA-256 per rank on the server's one thread) and the answer tells it so (``MOVED``): it sends no more. A
    party that resumes alone from a checkpoint of exactly the current round is sent the value it holds (bytes,
    not a wrong value)."""
    return any(rnd.kind is Kind.PUSHPULL and rnd.number > rnd.base for rnd in table.rounds.values())


def init_digest(message: Message) -> str | None:
    """The digest an INIT carries (None: the client holds nothing to compare, or says nothing)."""
    try:
        return decode_body(InitBody, message.body).digest
    except BodyError:
        return None


def value_mismatch(shape: tuple[int, ...], dtype: Any, message: Message) -> str | None:
    """The problem if ``message`` declares another shape or dtype than the stored value's (every push checks:
    the text is made only when they differ)."""
    if tuple(message.shape) == tuple(shape) and message.dtype == dtype:
        return None
    return (f"key {message.key} slice {message.slice} is {tuple(shape)} {dtype}, but the request says "
            f"{message.shape} {message.dtype}")


class InitHost(Protocol):
    """What INIT asks of the server (a fake one in unit tests)."""

    stored: dict[SliceId, SliceValue]
    table: RoundTable
    optimizer: Any  # the global server's optimizer (it is told which value each client holds), or None

    def send(self, peer: str, message: Message) -> None: ...

    def refuse(self, message: Message, text: str) -> None: ...

    def release(self, rnd: Round, value: np.ndarray | None, error: str | None = None,
                number: int | None = None) -> None: ...

    def forward(self, rnd: Round, message: Message) -> None: ...


class Inits:
    """INIT requests and rounds of one server, and the slices' shards (see the module docstring)."""

    def __init__(self, host: InitHost, is_global: bool) -> None:
        self.host = host
        self.is_global = is_global
        self.shard_id = 0  # a global server's own shard id
        self.shard_owner: dict[int, str] = {}  # a local server's global servers by explicit shard id (= rank)
        self.shards: dict[SliceId, int] = {}  # (key, slice) -> shard id, as declared by INIT
        self.sizes: dict[int, int] = {}  # key -> elements of its whole tensor, as declared by INIT

    def tensor_info(self, key: int, index: int, kind: TensorKind, direction: Direction) -> TensorInfo:
        """What a codec is told about slice ``index`` of ``key``: its whole tensor's size too, once INIT said it."""
        return TensorInfo(key, index, kind, direction, self.sizes.get(key))

    def owner(self, key: int, index: int) -> str:
        """The global server that holds (key, slice), by the shard id its INIT declared."""
        return self.shard_owner[self.shards[(key, index)]]

    def request(self, message: Message) -> None:
        """A client's INIT: answered at once if the slice has a value, else checked and added to its round."""
        host = self.host
        if message.dtype is None:
            host.refuse(message, f"INIT of key {message.key} carries no dtype and shape")
            return
        sid = (message.key, message.slice)
        host.table.clients.learn_owner(message.sender.decode(), sid)
        stored = host.stored.get(sid)
        if stored is not None:  # already initialized: answer with the current value (a late joiner)
            problem = value_mismatch(stored.value.shape, stored.value.dtype, message) or self.check_size(message)
            if problem:
                host.refuse(message, problem)
                return
            client = host.table.clients.client_of(message.sender.decode())
            self._received(sid, client, stored.value)  # a rejoiner holds these weights
            pushes = host.table.get(Kind.PUSHPULL, *sid)
            if pushes is not None:  # ... every round released so far: its next push is late only by those to come
                pushes.seen[client] = pushes.number
            moved = rounds_released(host.table)
            digest = init_digest(message)
            if digest is not None and not moved and digest == value_digest(stored.value):  # it holds them already
                host.send(message.sender.decode(), message.reply(body={SAME: True}))
                return
            body = {MOVED: True} if moved else None
            host.send(message.sender.decode(), message.reply(tensor=stored.value, body=body))
            return
        problem = self.check_shard(message) or self.check_size(message)
        if problem:
            host.refuse(message, problem)
            return
        current = host.table.get(Kind.INIT, message.key, message.slice)
        if current is not None and current.contributions:
            first = next(iter(current.contributions.values()))
            problem = value_mismatch(first.shape, first.dtype, message)
            if problem:
                host.refuse(message, problem + " (as declared by another client's INIT)")
                return
        host.table.contribute(message)

    def check_shard(self, message: Message) -> str | None:
        """Record the explicit shard id an INIT names (see geomx.core.sharding); the problem with it, if any."""
        where = f"INIT of key {message.key} slice {message.slice}"
        try:
            shard = decode_body(InitBody, message.body).shard
        except BodyError as exc:
            return f"{where} names no shard id (body {{'shard': int}}): {exc}"
        if self.is_global and shard != self.shard_id:
            return f"{where} is meant for shard {shard}, but this is shard {self.shard_id}"
        if not self.is_global and shard not in self.shard_owner:
            return f"{where} names shard {shard}; the global servers are shards {sorted(self.shard_owner)}"
        known = self.shards.setdefault((message.key, message.slice), shard)
        if known != shard:
            return f"{where} names shard {shard}, but another client placed it on shard {known} " \
                   "(every worker must init the same keys in the same order)"
        return None

    def check_size(self, message: Message) -> str | None:
        """Record the whole tensor's size an INIT names, if any; the problem with it (smaller than the slice, or
        not the size another client declared), if any."""
        try:
            numel = decode_body(InitBody, message.body).numel
        except BodyError as exc:
            return f"INIT of key {message.key} slice {message.slice}: {exc}"
        if numel is None:
            return None
        where = f"INIT of key {message.key} slice {message.slice} says its tensor has {numel} elements"
        piece = math.prod(message.shape or ())
        if numel < piece:
            return f"{where}, fewer than the slice's {piece}"
        known = self.sizes.setdefault(message.key, numel)
        if known != numel:
            return f"{where}, but another client declared {known} (every worker must init the same shapes)"
        return None

    def complete(self, rnd: Round) -> None:
        """A complete INIT round: a global server keeps the one value and answers it; a local server sends
        one INIT up (with the master worker's value, if it is in this party)."""
        host = self.host
        with_data = [m for m in rnd.contributions.values() if m.tensor is not None]
        first = next(iter(rnd.contributions.values()))
        sid = (rnd.key, rnd.slice)
        if self.is_global:
            if len(with_data) != 1:
                host.release(rnd, None, f"key {rnd.key}: {len(with_data)} clients sent an initial value; "
                                        "exactly one (the master worker's) is needed")
                return
            host.stored[sid] = SliceValue(np.array(with_data[0].tensor, copy=True))
            for client in rnd.contributions:  # every party starts from these weights
                self._received(sid, client, host.stored[sid].value)
            # the parties that hold these bytes already get no copy of them (the one that sent them too, when its
            # INIT carried their digest: a collective rank of the central party, say)
            digests = {client: init_digest(m) for client, m in rnd.contributions.items()}
            if any(digests.values()):
                mine = value_digest(host.stored[sid].value)
                rnd.same = {client for client, digest in digests.items() if digest == mine}
            host.release(rnd, host.stored[sid].value)
            return
        if len(with_data) > 1:
            host.release(rnd, None, f"key {rnd.key}: {len(with_data)} workers of this party sent an initial "
                                    "value; only the master worker may")
            return
        body: dict[str, int] = {"shard": self.shards[sid]}
        if rnd.key in self.sizes:
            body["numel"] = self.sizes[rnd.key]
        upward = Message(Kind.INIT, key=rnd.key, slice=rnd.slice, num_slices=first.num_slices,
                         tensor=with_data[0].tensor if with_data else None, dtype=first.dtype, shape=first.shape,
                         body=body)
        host.forward(rnd, upward)

    def _received(self, sid: SliceId, client: str, value: np.ndarray) -> None:
        """Tell a global server's optimizer which value ``client`` now holds (an optimizer that compensates
        for staleness keeps one per client)."""
        if self.is_global and self.host.optimizer is not None:
            self.host.optimizer.received(sid, client, value)
