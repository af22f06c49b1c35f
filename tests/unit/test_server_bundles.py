"""A real ``ParameterServer`` (built from a topology, never started: no sockets, its van's ``send`` recorded) answers
a bundle (``Kind.BUNDLE``) of PUSHPULLs in one message whose parts equal the answers the same pushes get alone,
early answers included; a part it refuses is refused in the bundle, by name, and the others go on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from geomx.config import NodeConfig, Role, load_topology
from geomx.core.rounds import EARLY
from geomx.protocol.wire import Flag, Kind, Message, decode, encode
from geomx.server import ParameterServer
from geomx.server.bundles import PART_IDS

PARTIES = ["ls0", "ls1", "ls2"]
KEYS = [0, 1, 2]


def global_server(tmp_path: Path) -> tuple[ParameterServer, list[tuple[str, Message]]]:
    """A global server of three one-worker parties whose clients are ``PARTIES``; every message it sends goes
    through the wire's encode and decode, as a receiver would see it."""
    path = tmp_path / "t.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("parties:\n  dc0: {workers: 1}\n  dc1: {workers: 1}\n  dc2: {workers: 1}\n")
    config = NodeConfig(role=Role.GLOBAL_SERVER, party="dc0", topology=load_topology(path),
                        global_scheduler="127.0.0.1:1", rank=0)
    server = ParameterServer(config)
    server.clients.present = set(PARTIES)
    sent: list[tuple[str, Message]] = []

    def send(peer: str, message: Message, *args: Any, **kwargs: Any) -> None:
        sent.append((peer, decode([bytes(f) for f in encode(message)])))

    server.van.send = send  # type: ignore[method-assign]
    server.van.knows = lambda peer: True  # type: ignore[method-assign]
    server._ready = True
    for key in KEYS:
        for i, party in enumerate(PARTIES):
            init = Message(Kind.INIT, key=key, request_id=100 + key, dtype=np.dtype(np.float32), shape=(2,),
                           tensor=np.array([1.0, 2.0], np.float32) if i == 0 else None, body={"shard": 0})
            server.redeliver(arrived(init, party))
    assert all(m.kind is not Kind.ERROR for _, m in sent)
    sent.clear()
    return server, sent


def arrived(message: Message, sender: str) -> Message:
    """``message`` as the server receives it from ``sender`` (through the wire)."""
    received = decode([bytes(f) for f in encode(message)])
    received.sender = sender.encode()
    return received


def push(key: int, values: list[float], request_id: int, priority: int = 0) -> Message:
    return Message(Kind.PUSHPULL, key=key, request_id=request_id, priority=priority,
                   tensor=np.array(values, np.float32))


def values(party: int, key: int) -> list[float]:
    return [float(party + key), float(2 * party - key)]


def run_step(server: ParameterServer, bundler_last: bool, bundle: bool, keys: list[int] = KEYS) -> None:
    """One round of every key: ``ls0`` pushes its keys in one bundle (or each alone), first or last."""
    order = ["ls1", "ls2", "ls0"] if bundler_last else ["ls0", "ls1", "ls2"]
    for party in order:
        pushes = [push(key, values(PARTIES.index(party), key), 10 + key) for key in keys]
        if party == "ls0" and bundle:
            server.redeliver(arrived(Message(Kind.BUNDLE, request_id=99, parts=pushes), party))
        else:
            for message in pushes:
                server.redeliver(arrived(message, party))


def answers(sent: list[tuple[str, Message]], peer: str) -> list[tuple[str, int, int, Any, Any]]:
    """What ``peer`` got, bundles opened: (kind, key, request id, body, tensor) of each message or part."""
    out = []
    for to, message in sent:
        if to != peer:
            continue
        for part in message.parts if message.kind is Kind.BUNDLE else [message]:
            tensor = None if part.tensor is None else part.tensor.tolist()
            out.append((f"{part.kind.name}{'/reply' if part.is_reply else ''}", part.key, part.request_id,
                        part.body, tensor))
    return out


@pytest.mark.parametrize("bundler_last", [False, True], ids=["bundle-first", "bundle-last-answered-early"])
def test_a_bundles_answers_equal_the_answers_of_its_pushes_sent_alone(tmp_path: Path, bundler_last: bool) -> None:
    runs = {}
    for bundle in (False, True):
        server, sent = global_server(tmp_path / str(bundle))
        for _ in range(2):
            run_step(server, bundler_last, bundle)
        runs[bundle] = (server, sent)
    (plain, plain_sent), (bundled, bundled_sent) = runs[False], runs[True]
    for peer in PARTIES:
        assert answers(bundled_sent, peer) == answers(plain_sent, peer), peer
    for key in KEYS:
        np.testing.assert_array_equal(bundled.stored[(key, 0)].value, plain.stored[(key, 0)].value)
    replies = [m for peer, m in bundled_sent if peer == "ls0" and m.is_reply]
    assert [m.kind for m in replies] == [Kind.BUNDLE] * 2  # one answer per bundle, every part in it
    assert [m.request_id for m in replies] == [99, 99] and [len(m.parts or []) for m in replies] == [3, 3]
    if bundler_last:  # the others' sums came first, then the bundle's bare answers settled them
        early = [m for peer, m in bundled_sent if peer == "ls0" and not m.is_reply]
        assert len(early) == 2 * len(KEYS) and all(EARLY in (m.body or {}) for m in early)
        assert all(p.tensor is None and EARLY in (p.body or {}) for m in replies for p in m.parts or [])
    assert len(bundled.bundles) == 0 and not bundled.bundles.slices and not bundled.bundles.early


def test_a_bundle_travels_behind_the_early_sums_it_settles(tmp_path: Path) -> None:
    """The early sums of key 1 left at priority -9 (its first contributor's): the bundle's answer, which settles
    them, is not queued ahead of them (the van sends the highest priority first)."""
    server, sent = global_server(tmp_path)
    for party in ("ls1", "ls2"):
        for key in KEYS:
            server.redeliver(arrived(push(key, values(1, key), 10 + key, priority=-9 if key == 1 else -1), party))
    early = [m for peer, m in sent if peer == "ls0"]
    assert [m.priority for m in early] == [-1, -9, -1] and not any(m.is_reply for m in early)
    pushes = [push(key, values(0, key), 10 + key, priority=-1) for key in KEYS]
    server.redeliver(arrived(Message(Kind.BUNDLE, request_id=5, priority=-1, parts=pushes), "ls0"))
    reply = sent[-1][1]
    assert sent[-1][0] == "ls0" and reply.kind is Kind.BUNDLE and reply.flags == Flag.REPLY
    assert reply.priority == -9


def test_a_part_the_server_refuses_is_refused_in_the_bundle_by_name_and_the_others_go_on(tmp_path: Path) -> None:
    server, sent = global_server(tmp_path)
    for party in ("ls1", "ls2"):
        server.redeliver(arrived(push(0, values(1, 0), 10), party))
    parts = [push(0, values(0, 0), 10), push(7, [1.0, 1.0], 17), push(1, [1.0, 1.0, 1.0], 11)]
    server.redeliver(arrived(Message(Kind.BUNDLE, request_id=5, parts=parts), "ls0"))
    reply = sent[-1][1]
    assert reply.kind is Kind.BUNDLE and [p.request_id for p in reply.parts or []] == [10, 17, 11]
    first, unknown, wrong = reply.parts or []
    assert first.kind is Kind.PUSHPULL and first.is_reply
    assert unknown.kind is Kind.ERROR and "key 7 slice 0 was never initialized" in unknown.body["error"]
    assert wrong.kind is Kind.ERROR and "is (2,) float32, but the request says (3,)" in wrong.body["error"]
    assert len(server.bundles) == 0


def test_a_bundle_from_a_stranger_is_refused_whole(tmp_path: Path) -> None:
    server, sent = global_server(tmp_path)
    server.redeliver(arrived(Message(Kind.BUNDLE, request_id=5, parts=[push(0, [1, 1], 10), push(1, [1, 1], 11)]),
                             "intruder"))
    ((peer, refusal),) = sent
    assert peer == "intruder" and refusal.kind is Kind.ERROR and refusal.request_id == 5
    assert "is not a client of this server" in refusal.body["error"] and len(server.bundles) == 0


def test_the_parts_carry_ids_of_the_servers_own_while_their_rounds_run(tmp_path: Path) -> None:
    """A part answered late (its round waits for other parties) is recognised by the server's id for it, whatever
    request ids the client chose (here the same for every part), and answered with its own."""
    server, sent = global_server(tmp_path)
    parts = [push(key, values(0, key), 3) for key in KEYS]
    server.redeliver(arrived(Message(Kind.BUNDLE, request_id=5, parts=parts), "ls0"))
    assert sent == [] and len(server.bundles) == 3
    assert all(part_id >= PART_IDS for _, part_id in server.bundles.parts)
    run_step(server, bundler_last=True, bundle=False, keys=KEYS)  # ls1 and ls2, then ls0's plain pushes (round 2)
    reply = next(m for peer, m in sent if peer == "ls0" and m.kind is Kind.BUNDLE)
    assert [p.request_id for p in reply.parts or []] == [3, 3, 3] and len(server.bundles) == 0
