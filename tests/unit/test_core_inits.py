"""INIT requests and rounds (geomx.core.inits) in one process, with a fake server (no sockets)."""

from __future__ import annotations

from typing import Any

import numpy as np

from geomx.core.clients import Clients
from geomx.core.inits import Inits
from geomx.core.rounds import Round, RoundTable, SliceValue
from geomx.protocol.wire import Kind, Message, decode, encode


class FakeServer:
    def __init__(self, clients: list[str], is_global: bool) -> None:
        self.name = "fake"
        self.stored: dict[tuple[int, int], SliceValue] = {}
        self.optimizer: Any = None
        self.sent: list[tuple[str, Message]] = []
        self.refused: list[str] = []
        self.forwarded: list[Message] = []
        self.inits = Inits(self, is_global)
        self.table = RoundTable(self, Clients(clients), _every_client())

    def send(self, peer: str, message: Message) -> None:
        self.sent.append((peer, message))

    def refuse(self, message: Message, text: str) -> None:
        self.refused.append(text)

    def release(self, rnd: Round, value: np.ndarray | None, error: str | None = None,
                number: int | None = None) -> None:
        self.table.release(rnd, value, error, number)

    def forward(self, rnd: Round, message: Message) -> None:
        self.forwarded.append(message)

    def complete(self, rnd: Round) -> None:
        self.inits.complete(rnd)

    def redeliver(self, message: Message) -> None:
        self.inits.request(message)

    def display(self, client: str) -> str:
        return client

    def answer_early(self, rnd: Round, message: Message) -> None:
        raise AssertionError("INIT rounds are never answered early")

    def all_done(self) -> None:
        pass


def _every_client() -> Any:
    from geomx.algorithms.fsa.server import FullySynchronous

    return FullySynchronous()


def init(sender: str, values: list[float] | None, shard: Any = 0, key: int = 0, numel: int | None = None) -> Message:
    tensor = np.array(values, dtype=np.float32) if values is not None else None
    body = {"shard": shard} if numel is None else {"shard": shard, "numel": numel}
    message = Message(Kind.INIT, key=key, tensor=tensor, dtype="float32", shape=(2,), body=body)
    message.sender = sender.encode()
    return message


def test_a_global_server_keeps_the_one_value_answers_everyone_and_late_joiners() -> None:
    server = FakeServer(["a", "b"], is_global=True)
    server.inits.request(init("a", [1.0, 2.0]))
    server.inits.request(init("b", None))
    assert (0, 0) in server.stored and sorted(peer for peer, _ in server.sent) == ["a", "b"]
    for _, reply in server.sent:
        np.testing.assert_array_equal(reply.tensor, [1.0, 2.0])
    server.inits.request(init("c", None))  # a late joiner: the current value at once
    assert server.sent[-1][0] == "c" and server.refused == []
    server.inits.request(Message(Kind.INIT, key=5, body={"shard": 0}))
    assert server.refused == ["INIT of key 5 carries no dtype and shape"]
    refused = FakeServer(["a"], is_global=True)
    refused.inits.request(init("a", [1.0, 2.0], shard=1))
    assert refused.refused == ["INIT of key 0 slice 0 is meant for shard 1, but this is shard 0"]


def test_a_late_joiner_has_seen_every_round_released_before_its_init() -> None:
    """Its next push is late (a round rule) or stale (MixedSync's count) only by the rounds released after its INIT,
    not by every round since the job started: a restarted party's first delta was dropped as many rounds late."""
    server = FakeServer(["a"], is_global=True)
    server.inits.request(init("a", [1.0, 2.0]))
    server.table.restore(Kind.PUSHPULL, 0, 0, 7)  # seven rounds of pushes released
    server.inits.request(init("c", None))
    assert server.table.get(Kind.PUSHPULL, 0, 0).seen == {"c": 7}


def test_a_local_server_sends_one_init_up_to_the_shard_its_workers_named() -> None:
    server = FakeServer(["w0", "w1"], is_global=False)
    server.inits.shard_owner = {0: "gs0", 1: "gs1"}
    server.inits.request(init("w0", [3.0, 4.0], shard=1))
    server.inits.request(init("w1", None, shard=1))
    upward, = server.forwarded
    assert upward.kind is Kind.INIT and upward.body == {"shard": 1} and server.inits.owner(0, 0) == "gs1"
    np.testing.assert_array_equal(upward.tensor, [3.0, 4.0])
    server.inits.request(init("w0", None, shard=0, key=1))
    server.inits.request(init("w1", None, shard=1, key=1))
    assert server.refused == ["INIT of key 1 slice 0 names shard 1, but another client placed it on shard 0 "
                              "(every worker must init the same keys in the same order)"]


def test_init_says_the_whole_tensors_size_codecs_gate_on_it_and_the_local_server_passes_it_up() -> None:
    server = FakeServer(["w0", "w1"], is_global=False)
    server.inits.shard_owner = {0: "gs0"}
    server.inits.request(init("w0", [3.0, 4.0], numel=6))  # slice 0 (2 elements) of a 6-element tensor
    server.inits.request(init("w1", None, numel=6))
    upward, = server.forwarded
    assert upward.body == {"shard": 0, "numel": 6}
    assert server.inits.tensor_info(0, 0, "gradient", "push").tensor_numel == 6
    assert server.inits.tensor_info(1, 0, "gradient", "push").tensor_numel is None  # never declared
    server.inits.request(init("w0", None, key=0, numel=8))
    server.inits.request(init("w0", None, key=2, numel=1))
    assert server.refused == [
        "INIT of key 0 slice 0 says its tensor has 8 elements, but another client declared 6 (every worker must "
        "init the same shapes)",
        "INIT of key 2 slice 0 says its tensor has 1 elements, fewer than the slice's 2"]


def test_a_client_that_holds_the_value_already_is_answered_without_it() -> None:
    """An INIT without the value but with the digest of what its client holds: the same bytes are not sent back
    (the body says so); another digest, or none, gets the value; so does a late joiner holding other bytes."""
    from geomx.core.inits import value_digest
    from geomx.core.rounds import SAME

    same = value_digest(np.array([1.0, 2.0], dtype=np.float32))
    other = value_digest(np.array([1.0, 2.5], dtype=np.float32))
    server = FakeServer(["a", "b", "c"], is_global=True)
    server.inits.request(init("a", [1.0, 2.0]))
    held = init("b", None)
    held.body = {"shard": 0, "digest": same}
    different = init("c", None)
    different.body = {"shard": 0, "digest": other}
    server.inits.request(held)
    server.inits.request(different)
    replies = dict(server.sent)
    assert replies["b"].tensor is None and replies["b"].body == {SAME: True}
    np.testing.assert_array_equal(replies["a"].tensor, [1.0, 2.0])  # the master's own INIT, as before
    np.testing.assert_array_equal(replies["c"].tensor, [1.0, 2.0])
    late = init("d", None)
    late.body = {"shard": 0, "digest": same}
    server.inits.request(late)
    assert server.sent[-1][0] == "d" and server.sent[-1][1].tensor is None and server.sent[-1][1].body == {SAME: True}
    stale = init("e", None)
    stale.body = {"shard": 0, "digest": other}
    server.inits.request(stale)
    np.testing.assert_array_equal(server.sent[-1][1].tensor, [1.0, 2.0])
    # the next INIT round of the slice starts with no one marked as holding it
    assert all(not rnd.same for rnd in server.table.rounds.values())


def test_once_the_job_s_model_moved_a_late_joiner_s_digest_is_not_compared_and_it_is_told_so() -> None:
    """After a round of pushes released since the server started, a late joiner (a restarted party: its seed's
    model) is sent the value without the server digesting it, and the answer says the model moved (its ranks send
    no more digests); on a resumed server nothing moved until a round is released beyond the checkpoint's."""
    from geomx.core.inits import MOVED, value_digest
    from geomx.core.rounds import SAME

    held = value_digest(np.array([1.0, 2.0], dtype=np.float32))
    for resumed_at in (0, 3):
        server = FakeServer(["a", "b"], is_global=True)
        server.inits.request(init("a", [1.0, 2.0]))
        server.inits.request(init("b", None))
        server.table.restore(Kind.PUSHPULL, 0, 0, resumed_at)
        late = init("c", None)
        late.body = {"shard": 0, "digest": held}
        server.inits.request(late)
        assert server.sent[-1][1].body == {SAME: True}  # nothing released since the (re)start: compared
        server.table.rounds[(Kind.PUSHPULL, 0, 0)].number += 1  # a round released
        server.inits.request(late)
        answer = server.sent[-1][1]
        assert answer.body == {MOVED: True}
        np.testing.assert_array_equal(answer.tensor, [1.0, 2.0])


def test_the_client_that_sent_the_value_with_its_digest_is_answered_without_it() -> None:
    """A collective rank of the central party sends the master's values and their digest: it is not sent them
    back (half the model in flight at once, for nothing); without a digest it gets them, as before."""
    from geomx.core.inits import value_digest
    from geomx.core.rounds import SAME

    for with_digest in (True, False):
        server = FakeServer(["a", "b"], is_global=True)
        master = init("a", [1.0, 2.0])
        if with_digest:
            master.body = {"shard": 0, "digest": value_digest(np.array([1.0, 2.0], dtype=np.float32))}
        server.inits.request(master)
        server.inits.request(init("b", None))
        replies = dict(server.sent)
        if with_digest:
            assert replies["a"].tensor is None and replies["a"].body == {SAME: True}
        else:
            np.testing.assert_array_equal(replies["a"].tensor, [1.0, 2.0])
        np.testing.assert_array_equal(replies["b"].tensor, [1.0, 2.0])  # no digest: the value


def test_an_init_or_push_of_another_shape_or_dtype_is_refused_naming_both() -> None:
    from geomx.core.inits import value_mismatch

    server = FakeServer(["a", "b"], is_global=True)
    server.inits.request(init("a", [1.0, 2.0]))
    server.inits.request(init("b", None))
    wider = Message(Kind.INIT, key=0, dtype="float32", shape=(3,), body={"shard": 0})
    wider.sender = b"c"
    server.inits.request(wider)
    assert server.refused == ["key 0 slice 0 is (2,) float32, but the request says (3,) float32"]
    pushed = decode(encode(Message(Kind.PUSHPULL, key=0, tensor=np.zeros(2, np.float64))))  # as received
    assert value_mismatch((2,), np.dtype(np.float32), pushed) == ("key 0 slice 0 is (2,) float32, but the request "
                                                                 "says (2,) float64")
    same = decode(encode(Message(Kind.PUSHPULL, key=0, tensor=np.zeros(2, np.float32))))
    assert value_mismatch((2,), np.dtype(np.float32), same) is None
