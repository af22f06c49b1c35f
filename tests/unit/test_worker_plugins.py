"""The worker's composition root and plug-ins (geomx.worker) with recording fakes: no sockets."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import numpy as np
import pytest

from geomx.algorithms.esync.kinds import STATE
from geomx.algorithms.esync.worker import StateRoundSteps
from geomx.algorithms.tsengine.kinds import RELAY
from geomx.algorithms.tsengine.worker import RelayRoute
from geomx.cluster.membership import AddressBook, Member
from geomx.codecs import FP16
from geomx.config import NodeConfig, Role, load_topology
from geomx.core.worker_plugins import PushRoute, WorkerContext
from geomx.protocol.bodies import BodyError
from geomx.protocol.wire import Kind, Message
from geomx.worker.compose import WorkerChoice, choose_worker, compose_worker

ME = Member("dc0/worker/a", Role.WORKER, "dc0", 0, "tcp://127.0.0.1:1")
FELLOW = Member("dc0/worker/b", Role.WORKER, "dc0", 1, "tcp://127.0.0.1:2")
SERVER = Member("dc0/local_server/s", Role.LOCAL_SERVER, "dc0", 0, "tcp://127.0.0.1:3")


class FakeVan:
    def __init__(self) -> None:
        self.peers: list[str] = []
        self.sent: list[tuple[str, Message]] = []

    def add_peer(self, identity: str, address: str, party: str, share: int = 1) -> None:
        self.peers.append(identity)

    def send(self, peer: str, message: Message) -> None:
        self.sent.append((peer, message))


class FakeRequests:
    def __init__(self, answer: dict[str, Any] | None = None) -> None:
        self.calls: list[tuple[str, Message]] = []
        self.answer = answer

    def call(self, peer: str, message: Message) -> Future[Message]:
        self.calls.append((peer, message))
        future: Future[Message] = Future()
        future.set_result(message.reply(body=self.answer))
        return future

    def wait(self, future: Future[Message], timeout: float, what: str) -> Message:
        return future.result(timeout)


def node(tmp_path: Any, extra: str = "") -> NodeConfig:
    path = tmp_path / "t.yaml"
    path.write_text("parties:\n  dc0: {workers: 2}\n  dc1: {workers: 1}\n" + extra)
    return NodeConfig(role=Role.WORKER, party="dc0", topology=load_topology(path), global_scheduler="127.0.0.1:1",
                      scheduler="127.0.0.1:2")


def context(requests: FakeRequests | None = None) -> WorkerContext:
    book = AddressBook((ME, FELLOW, SERVER))
    return WorkerContext(FakeVan(), requests or FakeRequests(), [SERVER.id], book, ME, 1.0)  # type: ignore[arg-type]


def test_a_plain_worker_pushes_directly_to_its_server(tmp_path: Any) -> None:
    config = node(tmp_path)
    assert choose_worker(config) == WorkerChoice()
    ctx = context()
    plugins = compose_worker(config, ctx)
    assert type(plugins.route) is PushRoute and not plugins.route.copies
    push = Message(Kind.PUSHPULL, key=2, tensor=np.ones(3, np.float32))
    assert plugins.route.push(SERVER.id, push).result().kind is Kind.PUSHPULL
    assert ctx.requests.calls == [(SERVER.id, push)]  # type: ignore[attr-defined]


def test_tsengine_inside_the_party_relays_through_the_fellow_workers(tmp_path: Any) -> None:
    config = node(tmp_path, "tsengine: {intra: true}\n")
    assert choose_worker(config) == WorkerChoice(route="relay")
    ctx = context()
    route = compose_worker(config, ctx).route
    assert isinstance(route, RelayRoute) and route.copies
    assert ctx.van.peers == [FELLOW.id]  # type: ignore[attr-defined]
    future = route.push(SERVER.id, Message(Kind.PUSHPULL, key=2, tensor=np.ones(3, np.float32)))
    assert not future.done() and ctx.requests.calls == []  # type: ignore[attr-defined]
    peer, ask = ctx.van.sent[-1]  # type: ignore[attr-defined]
    assert peer == SERVER.id and ask.kind == RELAY and ask.body == {"ask": True}
    instruction = Message(RELAY, key=2, body={"push": "server"})
    instruction.sender = SERVER.id.encode()
    assert route.handles(instruction) and ctx.requests.calls[-1][1].kind is Kind.PUSHPULL  # type: ignore[attr-defined]


def test_the_step_assigner_reads_this_workers_steps_from_the_state_round() -> None:
    requests = FakeRequests({"steps": {ME.name: 6, FELLOW.name: 2}})
    assert StateRoundSteps(context(requests)).assign(0.01, base_steps=2) == 6
    (server, report), = requests.calls
    assert server == SERVER.id and report.kind == STATE
    assert report.body == {"seconds_per_step": {ME.name: 0.01}, "base_steps": 2}
    with pytest.raises(ValueError, match="must be positive"):
        StateRoundSteps(context(requests)).assign(0.0, base_steps=2)
    with pytest.raises(RuntimeError, match="assigned no steps to dc0/worker0"):
        StateRoundSteps(context(FakeRequests({"steps": {}}))).assign(0.01, base_steps=2)
    with pytest.raises(BodyError, match=r"StepAssignment.steps\['dc0/worker0'\]: expected int, got str"):
        StateRoundSteps(context(FakeRequests({"steps": {ME.name: "six"}}))).assign(0.01, base_steps=2)


def test_the_fp16_switch_and_hfa_reach_the_worker_through_its_plug_ins(tmp_path: Any) -> None:
    plain = compose_worker(node(tmp_path), context())
    assert plain.lan_codec is None and plain.rescale_grad == pytest.approx(1 / 3)  # 3 workers' gradients summed
    fp16 = compose_worker(node(tmp_path, "fp16: true\n"), context())
    assert isinstance(fp16.lan_codec, FP16)
    hfa = compose_worker(node(tmp_path, "hfa: {k1: 2, k2: 1}\n"), context())
    assert hfa.rescale_grad == 1.0  # the global server receives a weighted average delta
