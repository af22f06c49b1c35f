"""TSEngine as a route plug-in, driven in one process by a fake server host (no sockets)."""

from __future__ import annotations

from typing import Any

import numpy as np

from geomx.algorithms.tsengine.kinds import RELAY
from geomx.algorithms.tsengine.server import TsEngineRoute, tsengine_route
from geomx.core.rounds import Round
from geomx.protocol.wire import Kind, Message

GS, LS1, LS2, LS3 = "gs", "ls1", "ls2", "ls3"


def relay(sender: str, round_: int = 0, body: dict[str, Any] | None = None, tensor: Any = None) -> Message:
    message = Message(RELAY, key=0, slice=0, round=round_, body=body,
                      tensor=None if tensor is None else np.asarray(tensor, dtype=np.float32))
    message.sender = sender.encode()
    return message


def push(sender: str, values: list[float]) -> Message:
    message = Message(Kind.PUSHPULL, key=0, slice=0, tensor=np.array(values, dtype=np.float32), request_id=7)
    message.sender = sender.encode()
    return message


def coordinator_with_round(make_server: Any) -> tuple[Any, TsEngineRoute, Round]:
    server = make_server(GS, [LS1, LS2, LS3])
    route = tsengine_route(server, max_greed=0.0, seed=0, coordinates=True, member=False)
    for ls in (LS1, LS2, LS3):
        server.table.contribute(push(ls, [1, 1, 1, 1]))
    return server, route, server.completed[0]


def test_a_coordinator_answers_everyone_without_the_value_then_hands_it_down_one_at_a_time(make_server: Any) -> None:
    server, route, rnd = coordinator_with_round(make_server)
    assert route.send_down(rnd, np.full(4, 3, dtype=np.float32))
    answers = [(peer, m) for peer, m in server.sent if m.kind is Kind.PUSHPULL]
    assert {peer for peer, _ in answers} == {LS1, LS2, LS3}
    assert all(m.body == {"ts": "relayed"} and m.tensor is None for _, m in answers)
    data = [(peer, m) for peer, m in server.sent if m.kind == RELAY]
    assert len(data) == 1 and data[0][1].tensor is not None  # one copy leaves the coordinator
    first = data[0][0]
    server.sent.clear()
    route.on_relay(relay(first, body={"ack": True}))
    # the coordinator serves the next target, and the first receiver is told to relay to another
    kinds = sorted("data" if m.tensor is not None else f"to {m.body['to']}" for _, m in server.sent)
    assert len(kinds) == 2 and "data" in kinds and any(k.startswith("to ") for k in kinds)
    assert route.answered_elsewhere(answers[0][1])


def test_the_dissemination_ends_when_every_target_acked_and_forgets_a_dropped_one(make_server: Any) -> None:
    server, route, rnd = coordinator_with_round(make_server)
    route.send_down(rnd, np.full(4, 3, dtype=np.float32))
    route.forget(LS3)
    acked: set[str] = set()
    while route.rounds:  # each receiver acks the copy it got: from the coordinator, or from a holder told to
        receivers = [m.body["to"] if m.body and "to" in m.body else peer
                     for peer, m in server.sent if m.kind == RELAY]
        fresh = [r for r in receivers if r not in acked]
        assert fresh, "the dissemination stalled"
        acked.add(fresh[0])
        route.on_relay(relay(fresh[0], body={"ack": True}))
    assert acked == {LS1, LS2} and route.values == {}


def test_a_member_holds_its_sum_asks_and_forwards_when_told(make_server: Any) -> None:
    server = make_server("ls1", ["w0"], upstream=[GS], peers={LS2})
    route = tsengine_route(server, max_greed=0.9, seed=0, coordinates=False, member=True)
    server.table.contribute(push("w0", [1, 2, 3, 4]))
    rnd = server.completed[0]
    assert route.send_up(rnd, {"tensor": np.array([1, 2, 3, 4], dtype=np.float32)})
    assert server.sent[-1] == (GS, server.sent[-1][1]) and server.sent[-1][1].body == {"ask": True}
    route.on_relay(relay(LS2, body={"merge": True}, tensor=[10, 10, 10, 10]))  # a fellow's sum joins ours
    route.on_relay(relay(GS, body={"push": "server"}))
    np.testing.assert_array_equal(server.forwarded[0].tensor, [11, 12, 13, 14])
    assert route.pending == {}


def test_a_member_takes_the_value_from_a_relay_acks_it_and_refuses_strangers(make_server: Any) -> None:
    server = make_server("ls1", ["w0"], upstream=[GS], peers={LS2})
    route = tsengine_route(server, max_greed=0.9, seed=0, coordinates=False, member=True)
    server.table.contribute(push("w0", [1, 2, 3, 4]))
    route.on_relay(relay("stranger", tensor=[5, 5, 5, 5]))
    assert server.refused == ["RELAY data must come from a global server or a fellow local server"]
    route.on_relay(relay(LS2, tensor=[5, 5, 5, 5]))
    np.testing.assert_array_equal(server.stored[(0, 0)].value, [5, 5, 5, 5])
    assert server.released[0][1] is not None and server.sent[-1][1].body == {"ack": True}


def test_a_server_that_neither_coordinates_nor_relays_refuses_relays(make_server: Any) -> None:
    server = make_server(GS, [LS1])
    route = tsengine_route(server, max_greed=0.9, seed=0, coordinates=False, member=False)
    route.on_relay(relay(LS1, body={"ask": True}))
    assert server.refused and "TSEngine here coordinates only this server's own clients (it is off)" \
        in server.refused[0]
    assert not route.send_down(Round(Kind.PUSHPULL, 0, 0), np.zeros(4))
