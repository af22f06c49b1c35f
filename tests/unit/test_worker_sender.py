"""One slice sender (``geomx.worker.sender``) for the kvstore and a collective party's ranks: the same slice of the
same tensor, pushed by ``KVStore._push`` and by ``PartyRanks.send``, leaves as the same message on the wire (payload,
codec, header), whichever codec it travels in; INIT messages are built there too; answers are waited for alike."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from geomx.codecs import default_registry, worker_codec
from geomx.collective.owners import OwnedSlice
from geomx.core.sharding import ShardPlanner
from geomx.kv import KVStore
from geomx.protocol.bodies import InitBody, decode_body
from geomx.protocol.wire import Kind, Message, encode
from geomx.worker.ranks import PartyRanks
from geomx.worker.sender import SliceSender
from geomx.worker.slices import KeyTable

SERVERS = ["gs0", "gs1"]
KEY = 3


class Recorder:
    """A push route and a requests table that record what is sent to whom, and answer nothing."""

    copies = False

    def __init__(self, carries_codecs: bool = True) -> None:
        self.carries_codecs = carries_codecs
        self.sent: list[tuple[str, Message]] = []
        self.together: list[tuple[str, list[tuple[int, int]]]] = []  # what push_together sent as one, per server
        self.names = {"gs0": "global server 0", "gs1": "global server 1"}

    def push(self, server: str, message: Message) -> Future[Message]:
        self.sent.append((server, message))
        return Future()

    call = push

    def push_together(self, server: str, messages: list[Message]) -> list[Future[Message]]:
        """A bundle's parts: each recorded as the message it is (``geomx.protocol.wire``: a part is exactly that)."""
        self.together.append((server, [(m.key, m.slice) for m in messages]))
        return [self.push(server, message) for message in messages]

    def wait(self, future: Future[Message], timeout: float, what: str) -> Message:
        if not future.done():
            raise TimeoutError(f"timed out waiting for {what}")
        return future.result()


def _sender(carries_codecs: bool = True) -> tuple[SliceSender, Recorder]:
    record = Recorder(carries_codecs)
    keys = KeyTable(ShardPlanner(len(SERVERS), slice_elems=40, spread=1), SERVERS)
    sender = SliceSender(record, keys, record, default_registry(), timeout_s=0.1)  # type: ignore[arg-type]
    return sender, record


def _wire(sent: list[tuple[str, Message]]) -> list[tuple[str, list[bytes]]]:
    return [(server, [bytes(frame) for frame in encode(message)]) for server, message in sent]


def _codec(spec: dict[str, Any] | None) -> Any:
    return None if spec is None else worker_codec(default_registry(), spec, 50)[1]  # a fresh one per caller


SPECS = [None, {"type": "fp16"}, {"type": "int8"}, {"type": "mpq", "threshold": 0.5}, {"type": "bsc", "threshold": 0.5}]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: "dense" if s is None else s["type"])
def test_the_kvstore_and_a_rank_send_a_slice_as_the_same_message(spec: dict[str, Any] | None,
                                                                   dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    tensor = torch.randn(10, 9).to(dtype)  # 90 elements: slices of at most 40 on 2 servers; above mpq's bound
    priority = 7

    store_sender, store_record = _sender()
    store_sender.keys.add(KEY, tensor)
    kv = SimpleNamespace(_keys=store_sender.keys, _route=store_record, _sender=store_sender, _pending={},
                         _plugins=SimpleNamespace(lan_codec=_codec(spec)))
    KVStore._push(kv, KEY, tensor, priority, snapshot=True)  # type: ignore[arg-type]

    rank_sender, rank_record = _sender()
    info = rank_sender.keys.add(KEY, tensor)
    ranks = PartyRanks(SimpleNamespace(world_size=1, rank=0), True, rank_sender)  # type: ignore[arg-type]
    ranks.codec = _codec(spec)
    flat = tensor.reshape(-1)
    pieces = [(OwnedSlice(KEY, index, len(info.slices), start, stop), flat[start:stop])
              for index, (start, stop) in enumerate(info.slices)]
    futures = ranks.send(pieces, [priority] * (KEY + 1))

    assert len(info.slices) > 1 and len(futures) == len(kv._pending[KEY]) == len(info.slices)
    assert {server for server, _ in store_record.sent} == set(SERVERS)
    if spec is not None or dtype == torch.bfloat16:  # encoded: a codec's payload, not the plain tensor
        assert all(message.encoded is not None for _, message in store_record.sent)
    assert sorted(_wire(store_record.sent)) == sorted(_wire(rank_record.sent))  # a rank's: grouped by server
    # the rank sends each server's slices together (one BUNDLE on the direct route), the kvstore each alone
    assert sorted(rank_record.together) == sorted(
        (server, [(KEY, i) for i in range(len(info.slices)) if rank_sender.server(KEY, i) == server])
        for server in SERVERS)
    assert store_record.together == []


def test_a_route_that_carries_no_codec_payload_gets_a_bfloat16_slice_plain_from_both() -> None:
    tensor = torch.randn(30).to(torch.bfloat16)
    sent = []
    for caller in ("kv", "ranks"):
        sender, record = _sender(carries_codecs=False)
        info = sender.keys.add(KEY, tensor)
        if caller == "kv":
            kv = SimpleNamespace(_keys=sender.keys, _route=record, _sender=sender, _pending={},
                                 _plugins=SimpleNamespace(lan_codec=None))
            KVStore._push(kv, KEY, tensor, 0, snapshot=True)  # type: ignore[arg-type]
        else:
            ranks = PartyRanks(SimpleNamespace(world_size=1, rank=0), True, sender)  # type: ignore[arg-type]
            ranks.send([(OwnedSlice(KEY, 0, 1, 0, 30), tensor)], [])
        assert len(info.slices) == 1 and record.sent[0][1].encoded is None
        sent.append(_wire(record.sent))
    assert sent[0] == sent[1]


def test_init_messages_carry_the_values_only_when_asked_and_the_digest_given() -> None:
    sender, record = _sender()
    sender.keys.add(KEY, torch.zeros(90))
    piece = np.arange(40, dtype=np.float32)
    sender.init(KEY, 0, piece, values=True)
    sender.init(KEY, 1, piece, values=False, digest="abc")
    (first_server, first), (second_server, second) = record.sent
    assert first.kind is Kind.INIT and first.num_slices == len(sender.keys[KEY].slices)
    assert np.array_equal(first.tensor, piece)
    assert second.tensor is None and second.shape == piece.shape and second.dtype == piece.dtype
    assert decode_body(InitBody, first.body) == InitBody(shard=sender.keys[KEY].shards[0], numel=90)
    assert decode_body(InitBody, second.body) == InitBody(shard=sender.keys[KEY].shards[1], numel=90, digest="abc")
    assert [first_server, second_server] == [sender.server(KEY, 0), sender.server(KEY, 1)]


def test_an_answer_is_waited_for_naming_the_server_key_and_slice() -> None:
    sender, _ = _sender()
    sender.keys.add(KEY, torch.zeros(90))
    answered: Future[Message] = Future()
    answered.set_result(Message(Kind.PUSHPULL, key=KEY, slice=1, tensor=np.ones(3, np.float32)))
    assert torch.equal(sender.data(sender.replies([answered], KEY, "PUSHPULL")[0], KEY, 1), torch.ones(3))
    name = sender.server_name(KEY, 2)
    with pytest.raises(TimeoutError, match=f"{name} to answer PUSHPULL of key {KEY} slice 2"):
        sender.reply(Future(), KEY, 2, "PUSHPULL")
    with pytest.raises(RuntimeError, match=f"answered key {KEY} slice 0 without data"):
        sender.data(Message(Kind.PUSHPULL, key=KEY), KEY, 0)


class Answering(Recorder):
    """Answers every INIT at once as a global server answers a late joiner once the job's model moved."""

    def push(self, server: str, message: Message) -> Future[Message]:
        from geomx.core.inits import MOVED

        self.sent.append((server, message))
        future: Future[Message] = Future()
        shape = tuple(message.shape or ())
        future.set_result(message.reply(tensor=np.full(shape, 7.0, np.float32), body={MOVED: True}))
        return future

    call = push


def test_a_rank_told_the_job_s_model_moved_sends_no_more_digests() -> None:
    """A restarted party's ranks digest their model for their INITs until an answer says the global servers moved
    on since they started (the wrapper's signature is INITed first): the model's 170 MB per rank are not hashed."""
    record = Answering()
    keys = KeyTable(ShardPlanner(len(SERVERS), slice_elems=40, spread=1), SERVERS)
    sender = SliceSender(record, keys, record, default_registry(), timeout_s=1.0)  # type: ignore[arg-type]
    group = SimpleNamespace(world_size=1, rank=0, party="dc1", broadcast=lambda tensor, source: None,
                            all_reduce=lambda tensor: None)
    ranks = PartyRanks(group, False, sender)  # type: ignore[arg-type]
    signature, model = torch.zeros(3), torch.zeros(90)
    ranks.init([KEY], [signature])
    assert decode_body(InitBody, record.sent[-1][1].body).digest is not None and not ranks.digests
    record.sent.clear()
    ranks.init([KEY + 1], [model])
    assert {decode_body(InitBody, m.body).digest for _, m in record.sent} == {None}
    assert model.tolist() == [7.0] * 90  # the values came
