"""The parameter server's parts (geomx.server) driven in one process: a real ``ParameterServer`` built from a
topology, never started (no sockets), its transport's ``send`` recorded. The plug-ins it composes decide, by
what they declare, whether it answers early and whether it takes a party back: the server names none."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from geomx.cluster.membership import GLOBAL_SCHEDULER_ID, Member
from geomx.config import NodeConfig, Role, load_topology
from geomx.core.plugins import Extension
from geomx.core.rounds import EARLY
from geomx.optim import SGD
from geomx.protocol.bodies import MembersNotice, encode_body
from geomx.protocol.wire import Kind, Message
from geomx.runs.checkpoint import Snapshot, write
from geomx.server import ParameterServer

PARTIES = ["ls0", "ls1", "ls2"]


class Sent:
    """What the server sent, by peer."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, Message]] = []

    def __call__(self, peer: str, message: Message, *args: Any, **kwargs: Any) -> None:
        self.messages.append((peer, message))

    def to(self, peer: str) -> list[Message]:
        return [m for p, m in self.messages if p == peer]


def global_server(tmp_path: Path, extra: str = "", resume: bool = False) -> tuple[ParameterServer, Sent]:
    """A global server of three one-worker parties whose local servers are ``PARTIES`` (``resume``: started
    with --resume, its checkpoint loaded)."""
    path = tmp_path / "t.yaml"
    path.write_text("parties:\n  dc0: {workers: 1}\n  dc1: {workers: 1}\n  dc2: {workers: 1}\n" + extra)
    config = NodeConfig(role=Role.GLOBAL_SERVER, party="dc0", topology=load_topology(path),
                        global_scheduler="127.0.0.1:1", rank=0, resume=resume)
    server = ParameterServer(config)
    if resume:
        assert server._resume()
    server.clients.present = set(PARTIES)
    sent = Sent()
    server.van.send = sent  # type: ignore[method-assign]
    server.van.knows = lambda peer: True  # type: ignore[method-assign]
    server._ready = True
    return server, sent


def is_error(message: Message) -> bool:
    return message.kind is Kind.ERROR


def request(kind: Kind, sender: str, tensor: list[float] | None = None, **fields: Any) -> Message:
    if tensor is not None and kind is Kind.PUSHPULL:
        fields = {"dtype": "float32", "shape": (len(tensor),), **fields}
    message = Message(kind, key=0, slice=0, num_slices=1,
                      tensor=None if tensor is None else np.array(tensor, dtype=np.float32), **fields)
    message.sender = sender.encode()
    message.request_id = 1
    return message


def initialized(server: ParameterServer, sent: Sent) -> None:
    for i, party in enumerate(PARTIES):
        server.redeliver(request(Kind.INIT, party, [1.0, 2.0] if i == 0 else None, dtype="float32", shape=(2,),
                                 body={"shard": 0}))
    assert [is_error(m) for _, m in sent.messages] == [False] * 3
    sent.messages.clear()


def test_an_fsa_round_sends_the_last_party_the_others_sum_then_answers_everyone(tmp_path: Path) -> None:
    server, sent = global_server(tmp_path)
    initialized(server, sent)
    server.redeliver(request(Kind.PUSHPULL, "ls0", [1.0, 1.0]))
    assert sent.messages == []  # two parties still missing: nothing early yet
    server.redeliver(request(Kind.PUSHPULL, "ls1", [2.0, 3.0]))
    (early,) = sent.to("ls2")  # the last party gets the others' sum before its push
    assert not early.is_reply and early.body == {EARLY: 0}
    np.testing.assert_array_equal(early.tensor, [3.0, 4.0])
    server.redeliver(request(Kind.PUSHPULL, "ls2", [4.0, 4.0]))
    for party in ("ls0", "ls1"):
        np.testing.assert_array_equal(sent.to(party)[-1].tensor, [7.0, 8.0])
    closing = sent.to("ls2")[-1]  # the round's answer to the last party carries no tensor, only the round
    assert closing.is_reply and closing.tensor is None and closing.body == {EARLY: 0}
    np.testing.assert_array_equal(server.stored[(0, 0)].value, [7.0, 8.0])


@pytest.mark.parametrize("extra", ["hfa: {k1: 2, k2: 3}\n", "fp16: true\n", "tsengine: {inter: true}\n",
                                   "early_answers: false\n", "dgt: {k: 0.5}\n"])
def test_a_plug_in_whose_answer_is_not_the_plain_sum_turns_early_answers_off(tmp_path: Path, extra: str) -> None:
    plain, _ = global_server(tmp_path)
    assert plain.pushpulls.answers_early()
    server, _ = global_server(tmp_path, extra)
    assert not server.pushpulls.answers_early()


def test_a_policy_that_answers_before_its_round_completes_turns_early_answers_off(tmp_path: Path) -> None:
    server, sent = global_server(tmp_path, "training: {staleness: 2}\n")
    server.configurers = {"ls0"}
    server.redeliver(request(Kind.CONFIGURE, "ls0", body={"sync": "dist_ssp"}))
    assert sent.to("ls0")[-1].is_reply and not is_error(sent.to("ls0")[-1])
    assert server.table.policy.name == "dist_ssp" and not server.pushpulls.answers_early()


def test_only_the_master_s_party_configures_and_unknown_settings_are_named(tmp_path: Path) -> None:
    server, sent = global_server(tmp_path)
    server.configurers = {"ls0"}
    server.redeliver(request(Kind.CONFIGURE, "ls1", body={"sync": "dist_async"}))
    assert "only the master worker may configure the servers" in str(sent.to("ls1")[-1].body)
    server.redeliver(request(Kind.CONFIGURE, "ls0", body={"colour": "red"}))
    assert "unknown key(s) ['colour']" in str(sent.to("ls0")[-1].body)
    assert server.table.policy.name == "dist_sync"


class HoldsRejoiners(Extension):
    def holds_rejoiners(self) -> bool:
        return True

    def rejoin_refusal(self, shards: int) -> str | None:
        return f"not with {shards} shards" if shards > 1 else None


def test_whether_a_party_may_rejoin_is_the_policy_s_and_the_extensions_call(tmp_path: Path) -> None:
    fsa, _ = global_server(tmp_path)
    assert "dist_sync cannot take a party back" in str(fsa.departures.rejoin_refusal())
    elastic, _ = global_server(tmp_path, "elastic: true\n")
    assert elastic.departures.rejoin_refusal() is None
    sharded, _ = global_server(tmp_path, "elastic: true\nglobal_servers: 2\n")
    assert sharded.departures.rejoin_refusal() is None
    sharded.extensions.append(HoldsRejoiners())
    assert sharded.departures.rejoin_refusal() == "not with 2 shards"


def test_under_mixedsync_a_party_leaves_alone_and_the_last_one_ends_the_server(tmp_path: Path) -> None:
    server, sent = global_server(tmp_path)
    server.configurers = {"ls0"}
    server.redeliver(request(Kind.CONFIGURE, "ls0", body={"sync": "dist_async"}))
    for i, party in enumerate(PARTIES):
        assert not server._done.is_set()
        server.redeliver(request(Kind.SHUTDOWN, party))
        assert sent.to(party)[-1].is_reply and len(server.clients.departed) == i + 1
    assert server._done.is_set()


def test_a_pull_of_a_slice_never_initialized_is_refused_naming_it(tmp_path: Path) -> None:
    server, sent = global_server(tmp_path)
    server.redeliver(request(Kind.PULL, "ls0"))
    assert "key 0 slice 0 was never initialized" in str(sent.to("ls0")[-1].body)
    server.redeliver(request(Kind.PUSHPULL, "stranger", [1.0, 1.0]))
    assert "'stranger' is not a client of this server" in str(sent.to("stranger")[-1].body)


def test_a_resumed_global_server_answers_with_its_checkpoint_s_optimizer_before_the_master_configures(
        tmp_path: Path) -> None:
    """INIT is answered at once from the checkpoint, so another party may push before the master's CONFIGURE
    arrives: its rounds must not start as plain sums (early answers) and end as optimizer steps."""
    trained = SGD(lr=0.1, momentum=0.9)
    trained.step((0, 0), np.ones(2, np.float32), np.ones(2, np.float32))
    layout, state = trained.state()
    write(tmp_path / "ckpt", 0, Snapshot(2, {(0, 0): np.ones(2, np.float32)}, {(0, 0): 2}, trained.spec(), state,
                                         layout))
    server, sent = global_server(tmp_path, "checkpoint: {dir: ckpt, every_steps: 2}\n", resume=True)
    resumed = server.optimizer
    assert resumed is not None and resumed.spec() == trained.spec() and not server.pushpulls.answers_early()
    np.testing.assert_array_equal(resumed.state()[1][next(iter(state))], next(iter(state.values())))
    server.configurers = {"ls0"}
    server.redeliver(request(Kind.CONFIGURE, "ls0", body={"optimizer": trained.spec()}))
    assert not is_error(sent.to("ls0")[-1]) and server.optimizer is resumed  # same spec: the restored state stays


def push_of(sender: str, key: int, value: float) -> Message:
    message = Message(Kind.PUSHPULL, key=key, slice=0, num_slices=1, tensor=np.full(2, value, np.float32),
                      dtype="float32", shape=(2,))
    message.sender = sender.encode()
    message.request_id = 10 + key
    return message


def test_a_party_back_in_the_middle_of_the_others_round_meets_their_next_round_on_every_slice(
        tmp_path: Path) -> None:
    """The others' round had released key 0 but not yet key 1 when the restarted party came back: it is held until
    key 1's round ends too, so its first pushes meet the others' next round of both keys. Without the hold key 1's
    round waited for it while its own first push of key 0 waited for the others' next round: the recovery bench's
    deadlock (both sides stalled until the round timeout)."""
    server, sent = global_server(tmp_path, "elastic: true\n")
    server.van.add_peer = lambda *args, **kwargs: None  # type: ignore[method-assign]
    for key in (0, 1):
        for i, party in enumerate(PARTIES):
            init = Message(Kind.INIT, key=key, slice=0, num_slices=1, dtype="float32", shape=(2,),
                           tensor=np.zeros(2, np.float32) if i == 0 else None, body={"shard": 0})
            init.sender, init.request_id = party.encode(), 1
            server.redeliver(init)
    for key in (0, 1):  # a first round of every party
        for party in PARTIES:
            server.redeliver(push_of(party, key, 1.0))
    server.departures.member_dead("ls2", "no heartbeat")
    for party in PARTIES[:2]:
        server.redeliver(push_of(party, 0, 1.0))
    assert all(m.is_reply for party in PARTIES[:2] for m in sent.to(party)[-1:])  # key 0's round is out
    sent.messages.clear()
    back = Member("ls2b", Role.LOCAL_SERVER, "dc2", 0, "127.0.0.1:2")
    notice = Message(Kind.MEMBERS, body=encode_body(MembersNotice(member=back.to_json(), replaces="ls2")))
    notice.sender, notice.request_id = GLOBAL_SCHEDULER_ID.encode(), 1
    server.redeliver(notice)
    assert sent.to(GLOBAL_SCHEDULER_ID)[-1].is_reply
    early = push_of("ls2b", 0, 5.0)  # its first push of key 0 comes before the others' round of key 1 ends
    server.redeliver(early)
    for party in PARTIES[:2]:
        server.redeliver(push_of(party, 1, 1.0))
    assert {p for p, m in sent.messages if m.kind is Kind.PUSHPULL and m.key == 1 and m.is_reply} == set(PARTIES[:2])
    sent.messages.clear()
    for party in PARTIES[:2]:  # the others' next round: it meets ls2b's first push on both keys
        server.redeliver(push_of(party, 0, 1.0))
    server.redeliver(push_of("ls2b", 1, 5.0))
    for party in PARTIES[:2]:
        server.redeliver(push_of(party, 1, 1.0))
    answers = {(p, m.key): m for p, m in sent.messages if m.kind is Kind.PUSHPULL and m.is_reply}
    assert set(answers) == {(p, k) for p in [*PARTIES[:2], "ls2b"] for k in (0, 1)}
    for key in (0, 1):  # 1 + 1 + 5, nothing rescaled: ls2b's push is in the round (ls1 got the others' sum early)
        assert answers[("ls2b", key)].tensor.tolist() == [7.0, 7.0]  # type: ignore[union-attr]
