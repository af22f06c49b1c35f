"""Typed message bodies: one dataclass per request (or answer) that carries a JSON body, checked on decode.

A body is JSON on the wire (``Message.body``); these classes say which keys each kind carries and of what
type, so a sender cannot misspell a key and a receiver gets a precise error naming the kind, the key and what
was wrong, instead of a KeyError deep in a handler. The worker side (``geomx.kv``, ``geomx.worker``) builds
its requests and reads its answers through them; the servers (``geomx.server``, ``geomx.core.inits``) and the
schedulers read theirs through them. An algorithm declares its own bodies in its folder (ESync's:
``geomx.algorithms.esync.bodies``) and encodes and checks them with the same two functions.

Usage::

    message = Message(Kind.INIT, key=3, body=encode_body(InitBody(shard=1, numel=4096)))
    init = decode_body(InitBody, message.body)               # BodyError if a key is missing or mistyped
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass
from typing import Any, TypeVar

Spec = dict[str, Any]  # a spec the receiver checks itself (an optimizer's or a codec's), JSON all the way down
B = TypeVar("B")


class BodyError(ValueError):
    """A message body that does not match its kind's dataclass."""


@dataclass(frozen=True)
class InitBody:
    """INIT, worker -> server: the global server (shard id) that owns this slice, and the elements of the whole
    tensor it is a slice of (codecs' size gates decide per tensor; None from a client that does not say).
    ``digest``: what the client holds (``geomx.core.inits.value_digest``), whether it sends the initial value or
    not; a global server whose value has the same digest answers without the value (the body ``{"same": true}``)."""

    shard: int
    numel: int | None = None
    digest: str | None = None


@dataclass(frozen=True)
class PullBody:
    """PULL, worker -> local server: ``held``: the job's model as this party holds it, answered by the local
    server without asking the tier above (``geomx.kv.KVStore.pull_job_model``)."""

    held: bool = False


@dataclass(frozen=True)
class ConfigureBody:
    """CONFIGURE, master worker -> servers: what to switch (the keys left out stay as they are)."""

    sync: str | None = None
    optimizer: Spec | None = None
    compression: Spec | None = None


@dataclass(frozen=True)
class MembersNotice:
    """MEMBERS, global scheduler -> global servers: a restarted party's local server (its address-book entry,
    ``Member.to_json()``) replaces the dead one with identity ``replaces``."""

    member: dict[str, Any]
    replaces: str


@dataclass(frozen=True)
class ShutdownNotice:
    """SHUTDOWN, a server -> its schedulers: it stops; ``failed`` says why, if it had to (the schedulers tell
    everyone at once)."""

    failed: str | None = None


# Upper bounds (seconds) of the buckets a server counts its rounds' durations in (``HeartbeatBody.round_counts``;
# Prometheus' histogram ``geomx_round_duration_seconds``): from a LAN round on one host to a WAN round under loss.
ROUND_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass(frozen=True)
class HeartbeatBody:
    """HEARTBEAT, a node -> its scheduler(s): what it has counted so far, for the global scheduler's status page
    (``geomx.cluster.status``). Bytes are cumulative since the process started; ``step``: a worker's training
    steps, a server's completed rounds (of its least advanced slice); ``busy``: a worker's share of wall time spent
    computing rather than waiting for the network (0..1); ``party``: a local server's relay of its party's members as
    its party's scheduler last described them (name -> ``geomx.cluster.status`` member record), since they beat to
    that scheduler alone; ``round_counts``: a server's completed rounds (one per slice) by duration, from its first
    contribution to its answer, per ``ROUND_BUCKETS_S`` bucket and one more above the last, and ``round_seconds``
    their summed durations; ``leads``: a global server's answers per client (by name), how many of them let it run
    how many rounds ahead of its round (``"0"``: the round was complete; more only under SSP: its staleness);
    ``push_staleness``: a global server's pushes per client (by name) by their staleness, the updates of their
    slice applied since the client's last answer for it (counted where pushes apply on arrival: MixedSync);
    ``models``: a worker's digests of its model (``geomx.torch.digest``) at its last few digested steps (step ->
    hex digest), where its algorithm gives every party the same model then (a party relays them in ``party``).
    ``lan_saved``, ``wan_saved``: bytes its codecs kept off each link class (an encoded message's dense size less
    its frames). ``outer_rounds``: a global server's decoupled rounds per client (by name): how many it was on time
    for, missed, had folded in late, had dropped (``geomx.algorithms.hfa.quorum``). An empty body is a plain
    heartbeat."""

    lan_sent: int = 0
    lan_recv: int = 0
    wan_sent: int = 0
    wan_recv: int = 0
    step: int | None = None
    busy: float | None = None
    party: dict[str, dict[str, Any]] | None = None
    round_counts: list[int] | None = None
    round_seconds: float | None = None
    leads: dict[str, dict[str, int]] | None = None
    lan_saved: int = 0
    wan_saved: int = 0
    push_staleness: dict[str, dict[str, int]] | None = None
    models: dict[str, str] | None = None
    outer_rounds: dict[str, dict[str, int]] | None = None


# PUSHPULL body key beside a codec's: the samples (tokens) the pusher processed since its last contribution (a
# worker's to its local server, a local server's party total to a global server); decoupled rounds merge by them
TOKENS = "tokens"


def push_tokens(body: dict[str, Any] | None) -> int | None:
    """The ``TOKENS`` of a PUSHPULL body (None: not reported); BodyError unless a non-negative integer."""
    value = (body or {}).get(TOKENS)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
        raise BodyError(f"PUSHPULL.{TOKENS}: expected a non-negative integer, got {value!r}")
    return value


def encode_body(body: Any) -> dict[str, Any]:
    """``body`` (a body dataclass: this module's or an algorithm's) as a JSON body; fields left None are left out."""
    if not dataclasses.is_dataclass(body) or isinstance(body, type):
        raise TypeError(f"expected a message body dataclass, got {type(body).__name__}")
    return {f.name: getattr(body, f.name) for f in dataclasses.fields(body) if getattr(body, f.name) is not None}


def decode_body(cls: type[B], body: dict[str, Any] | None) -> B:
    """``body`` checked against ``cls``: unknown, missing or mistyped keys raise BodyError naming them."""
    name = cls.__name__
    if not isinstance(body, dict):
        raise BodyError(f"{name}: expected a JSON object body, got {type(body).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(body) - set(fields))
    if unknown:
        raise BodyError(f"{name}: unknown key(s) {unknown}; valid: {sorted(fields)}")
    values = {}
    for key, field in fields.items():
        if key not in body:
            if field.default is dataclasses.MISSING:
                raise BodyError(f"{name}: missing key {key!r}")
            continue
        values[key] = _check(f"{name}.{key}", hints[key], body[key])
    return cls(**values)


def _check(where: str, hint: Any, value: Any) -> Any:
    """``value`` if it is of the type ``hint`` names (ints pass as floats, bool never as a number), else BodyError."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        return _check(where, options[0], value) if len(options) == 1 else value
    if origin is list:
        if not isinstance(value, list):
            raise BodyError(f"{where}: expected a list, got {type(value).__name__}")
        item_type = args[0] if args else Any
        return [_check(f"{where}[{index}]", item_type, item) for index, item in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise BodyError(f"{where}: expected an object, got {type(value).__name__}")
        key_type, value_type = args or (str, Any)
        return {_check(f"{where} key", key_type, k): _check(f"{where}[{k!r}]", value_type, v)
                for k, v in value.items()}
    if hint is Any:
        return value
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, bool) and hint is not bool:
        raise BodyError(f"{where}: expected {hint.__name__}, got a bool")
    if not isinstance(value, hint):
        raise BodyError(f"{where}: expected {hint.__name__}, got {type(value).__name__} {value!r}")
    return value
