"""Bundles on the wire (``Kind.BUNDLE``): several PUSHPULLs as one message, each part the message it would be alone
but for its compact header; forged bundles and compact headers refused by name; ``Requests.call_together`` handing
each part its own future."""

from __future__ import annotations

import json
from concurrent.futures import Future
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from geomx.protocol import kinds, wire
from geomx.protocol.compact import compact, expand
from geomx.protocol.wire import (
    MAX_BUNDLE_PARTS,
    PROTOCOL_VERSION,
    Flag,
    Kind,
    Message,
    WireError,
    bundled,
    decode,
    encode,
)
from geomx.transport.rpc import RemoteError, Requests


def to_bytes(frames: list[Any]) -> list[bytes]:
    return [bytes(f) for f in frames]


def push(key: int, index: int = 0, size: int = 4, priority: int = 0, **fields: Any) -> Message:
    return Message(Kind.PUSHPULL, key=key, slice=index, num_slices=index + 1, priority=priority, round=3,
                   request_id=10 + key, tensor=np.arange(size, dtype=np.float32) + key, **fields)


def encoded_push(key: int) -> Message:
    """A push in a codec's frames (the raw bytes travel as they are, the codec's meta in the body)."""
    return Message(Kind.PUSHPULL, key=key, num_slices=1, codec=5, dtype=np.dtype(np.float32), shape=(8,),
                   encoded=[np.arange(3, dtype=np.uint8), np.arange(5, dtype=np.uint8)], body={wire.CODEC_META: {}})


def bundle_frames(parts: list[Message], reply: bool = False) -> list[bytes]:
    flags = Flag.REPLY if reply else Flag.NONE
    return to_bytes(encode(Message(Kind.BUNDLE, request_id=7, priority=-3, flags=flags, parts=parts)))


def as_part(frames: list[bytes]) -> list[bytes]:
    """A message's frames as a bundle's part: its header compact (forging a part the encoder would refuse)."""
    fields = wire._HEADER.unpack_from(frames[0], 0)
    dims = np.frombuffer(frames[0][wire._HEADER.size:], "<u8").tolist()
    return [compact(fields[2:], dims), *frames[1:]]


def test_the_kinds_live_in_their_own_module_and_the_wire_speaks_version_4() -> None:
    assert wire.Kind is kinds.Kind and wire.PluginKind is kinds.PluginKind and Kind.BUNDLE == 12
    assert PROTOCOL_VERSION == 4  # 4: a bundle's parts' headers are compact


def test_each_part_of_a_bundle_is_the_message_it_would_be_alone_with_a_compact_header() -> None:
    parts = [push(1, priority=-1), push(2, 1, size=6, priority=-2, body={"x": 1}), encoded_push(3)]
    frames = bundle_frames(parts)
    alone = [to_bytes(encode(part)) for part in parts]
    at = 2
    for message in alone:  # the parts' own frames, in order, each header compact
        assert len(frames[at]) <= 16 < len(message[0]) and frames[at + 1:at + len(message)] == message[1:]
        at += len(message)
    assert json.loads(frames[1]) == {"parts": [len(message) for message in alone]}
    message = decode(frames)
    assert message.kind is Kind.BUNDLE and message.request_id == 7 and message.priority == -3
    assert not message.is_reply and message.tensor is None
    assert message.parts is not None and len(message.parts) == 3
    for got, sent in zip(message.parts, parts, strict=True):
        assert to_bytes(encode(got)) == to_bytes(encode(sent))  # each part decodes to what it was


def test_a_reply_bundle_carries_answers_and_refusals() -> None:
    answer = push(1).reply(tensor=np.ones(2, np.float32))
    refusal = push(2).error("key 2 slice 0 was never initialized")
    message = decode(bundle_frames([answer, refusal], reply=True))
    assert message.is_reply and [p.kind for p in message.parts or []] == [Kind.PUSHPULL, Kind.ERROR]
    assert message.parts is not None and message.parts[1].body == {"error": "key 2 slice 0 was never initialized"}


def forged(frames: list[bytes], body: Any) -> list[bytes]:
    return [frames[0], json.dumps(body).encode(), *frames[2:]]


@pytest.mark.parametrize(("forge", "named"), [
    (lambda f: f[:-1], "declares 6 frames but carries 5"),                        # truncated
    (lambda f: forged(f, {"parts": [3, 2]}), "declares 5 frames but carries 6"),  # part count wrong
    (lambda f: forged(f, {"parts": [3, 3, 3]}), "declares 9 frames"),
    (lambda f: forged(f, {"parts": [3, 3], "owner": 1}), "unknown keys ['owner']"),
    (lambda f: forged(f, {}), "needs 'parts'"),
    (lambda f: forged(f, {"parts": []}), "needs 'parts'"),
    (lambda f: forged(f, {"parts": [4, 2]}), "bundle part 0: "),                   # parts cut at the wrong frame
    (lambda f: forged(f, {"parts": [3, "3"]}), "frame counts must be integers"),
    (lambda f: forged(f, {"parts": [1, 5]}), "frame counts must be integers"),
    (lambda f: f[:2], "declares 6 frames but carries 0"),
])
def test_a_forged_bundle_is_refused_by_name(forge: Any, named: str) -> None:
    frames = bundle_frames([push(1), push(2)])
    with pytest.raises(WireError, match=named.replace("[", r"\[").replace("]", r"\]")):
        decode(forge(frames))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_a_mutated_bundle_raises_only_wire_error(data: st.DataObject) -> None:
    """Bytes flipped, frames dropped, repeated or swapped, the body rewritten: decoding raises WireError or yields
    a bundle of PUSHPULLs; nothing else (a server's van drops what raises WireError, naming why, and goes on)."""
    frames = bundle_frames([push(1), encoded_push(2), push(3, size=0)])
    for _ in range(data.draw(st.integers(1, 3))):
        how = data.draw(st.integers(0, 4))
        index = data.draw(st.integers(0, len(frames) - 1)) if frames else 0
        if how == 0 and frames and frames[index]:
            raw = bytearray(frames[index])
            raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
            frames[index] = bytes(raw)
        elif how == 1 and frames:
            del frames[index]
        elif how == 2 and frames:
            frames.insert(index, frames[data.draw(st.integers(0, len(frames) - 1))])
        elif how == 3 and len(frames) > 1:
            other = data.draw(st.integers(0, len(frames) - 1))
            frames[index], frames[other] = frames[other], frames[index]
        elif how == 4 and len(frames) > 1:
            counts = data.draw(st.lists(st.integers(-1, 12), max_size=4)) if data.draw(st.booleans()) else 3
            frames[1] = json.dumps({"parts": counts}).encode()
    try:
        message = decode(frames)
    except WireError:
        return
    if message.kind is Kind.BUNDLE:
        assert all(part.kind is Kind.PUSHPULL and not part.is_reply for part in message.parts or [])


@settings(max_examples=200, deadline=None)
@given(fields=st.tuples(st.integers(0, 255), st.integers(0, 255), st.integers(0, 255), st.integers(0, 255),
                        st.integers(-(1 << 31), (1 << 31) - 1), st.integers(-(1 << 63), (1 << 63) - 1),
                        st.integers(0, (1 << 32) - 1), st.integers(0, (1 << 32) - 1), st.integers(0, (1 << 64) - 1),
                        st.integers(0, (1 << 64) - 1)),
       dims=st.lists(st.integers(0, (1 << 64) - 1), max_size=8))
def test_a_compact_header_expands_to_its_fields_at_every_fields_extremes(fields: tuple[int, ...],
                                                                         dims: list[int]) -> None:
    """Every value each field of the fixed header can hold, and up to 8 dimensions of up to 64 bits, round-trip."""
    full = [*fields[:4], len(dims), *fields[4:]]
    assert expand(compact(full, dims)) == (full, dims)


@pytest.mark.parametrize(("header", "named"), [
    (b"\x03\x00\x00\x01", "shorter than its 5 fixed bytes"),
    (b"\x03\x00\x00\x01\x01\x00\x02\x00\x01\x0a", "round is cut off"),
    (b"\x03\x00\x00\x01\x01\x00\x02\x00\x01\x0a\x03", "dimension 0 is cut off"),
    (b"\x03\x00\x00\x01\x01\x00\x02\x00\x01\x0a\x03\x04\x00", "1 bytes after its last field"),
    (b"\x03\x00\x00\x01\x01" + b"\xff" * 11, "priority runs past 10 bytes"),
    (b"\x03\x00\x00\x01\x01\x80\x80\x80\x80\x10", "priority 2147483648 is outside"),
    (b"\x03\x00\x00\x01\x01\x00\x02\x00" + b"\xff" * 9 + b"\x7f", "num_slices is beyond 64 bits"),
    (b"\x03\x00\x00\x01\x01\x00\x02\x00\x80\x80\x80\x80\x10", r"num_slices 4294967296 is outside"),
    (b"\x03\x00\x00\x01\x01\x00\x02\x03\x01\x0a\x03\x04", "slice 3 of 1 is impossible"),
])
def test_a_forged_compact_header_is_refused_by_name(header: bytes, named: str) -> None:
    """A part's compact header: truncated, overlong, out of its field's range, trailing bytes, or (expanded) not a
    valid header: WireError naming the part and the field."""
    frames = bundle_frames([push(1), push(2)])
    assert frames[2] == b"\x03\x00\x00\x01\x01\x00\x02\x00\x01\x0b\x03\x04"  # kind .. ndim, then varints
    with pytest.raises(WireError, match=f"bundle part 0: .*{named}"):
        decode([frames[0], frames[1], header, *frames[3:]])


def test_a_bundle_inside_a_bundle_is_refused() -> None:
    inner = bundle_frames([push(1), push(2)])
    outer = bundle_frames([push(3), push(4)])
    nested = [outer[0], json.dumps({"parts": [3, len(inner)]}).encode(), *outer[2:5], *as_part(inner)]
    with pytest.raises(WireError, match="bundle part 1: a bundle inside a bundle"):
        decode(nested)
    with pytest.raises(WireError, match="a bundle inside a bundle"):
        encode(Message(Kind.BUNDLE, parts=[push(1), Message(Kind.BUNDLE, parts=[push(2)])]))


@pytest.mark.parametrize(("part", "named"), [
    (Message(Kind.INIT, key=1), "not INIT"),
    (Message(Kind.PULL, key=1), "not PULL"),
    (push(2).reply(), "a request bundle holds requests only"),
])
def test_a_bundle_carries_only_pushpulls_and_their_answers(part: Message, named: str) -> None:
    frames = bundle_frames([push(1), push(3)])
    alone = as_part(to_bytes(encode(part)))
    swapped = [frames[0], json.dumps({"parts": [3, len(alone)]}).encode(), *frames[2:5], *alone]
    with pytest.raises(WireError, match=f"bundle part 1: .*{named}"):
        decode(swapped)
    with pytest.raises(WireError, match=named):
        encode(Message(Kind.BUNDLE, parts=[push(1), part]))


def test_a_bundle_header_carries_nothing_of_its_own() -> None:
    frames = bundle_frames([push(1), push(2)])
    header = bytearray(frames[0])
    fields = list(wire._HEADER.unpack_from(header, 0))
    fields[8] = 5  # the key
    with pytest.raises(WireError, match="header carries no tensor, key, slice or round"):
        decode([wire._HEADER.pack(*fields), *frames[1:]])
    with pytest.raises(WireError, match=f"1..{MAX_BUNDLE_PARTS} parts, not 0"):
        encode(Message(Kind.BUNDLE, parts=[]))


def test_bundled_cuts_runs_by_bytes_and_parts_and_sends_a_large_message_alone() -> None:
    small = [push(k, size=100) for k in range(5)]  # 400 bytes each
    assert [len(run) for run in bundled(small, max_bytes=1000)] == [2, 2, 1]
    assert [len(run) for run in bundled(small, max_parts=3)] == [3, 2]
    big = push(9, size=1000)
    assert [[m.key for m in run] for run in bundled([small[0], big, small[1]], max_bytes=1000)] == [[0], [9], [1]]
    assert [len(run) for run in bundled([push(k, size=1) for k in range(2500)])] == [1024, 1024, 452]


class FakeVan:
    def __init__(self) -> None:
        self.sent: list[tuple[str, Message]] = []

    def send(self, peer: str, message: Message) -> None:
        self.sent.append((peer, decode(to_bytes(encode(message)))))  # what the server would receive


def answer(requests: Requests, bundle: Message, parts: list[Message]) -> None:
    reply = decode(to_bytes(encode(Message(Kind.BUNDLE, request_id=bundle.request_id, flags=Flag.REPLY,
                                           parts=parts))))
    reply.sender = b"gs"
    assert requests.resolve(reply)


def test_call_together_sends_one_bundle_and_resolves_each_part_with_its_own_answer() -> None:
    van = FakeVan()
    requests = Requests(van)  # type: ignore[arg-type]
    pushes = [push(1, priority=-1), push(2, priority=-5), push(3, priority=0)]
    futures = requests.call_together("gs", pushes)
    (peer, bundle), = van.sent
    assert peer == "gs" and bundle.kind is Kind.BUNDLE and bundle.priority == -5  # its parts' lowest
    parts = bundle.parts or []
    assert [p.key for p in parts] == [1, 2, 3] and len({p.request_id for p in parts}) == 3
    answer(requests, bundle, [parts[0].reply(tensor=np.ones(1, np.float32)), parts[1].error("no key 2"),
                              parts[2].reply(tensor=np.zeros(1, np.float32))])
    assert futures[0].result(0).tensor.tolist() == [1.0] and futures[0].result(0).sender == b"gs"
    with pytest.raises(RemoteError, match="gs refused the request: no key 2"):
        futures[1].result(0)
    assert futures[2].result(0).tensor.tolist() == [0.0]
    assert len(requests) == 0


def test_a_bundle_part_its_waiter_cancelled_is_left_alone_and_the_others_resolve() -> None:
    """As a lone request's (Requests.resolve): setting a cancelled part would raise InvalidStateError in the
    bundle's callback and leave the parts after it unresolved."""
    van = FakeVan()
    requests = Requests(van)  # type: ignore[arg-type]
    futures = requests.call_together("gs", [push(1), push(2), push(3)])
    assert futures[1].cancel()
    (_, bundle), = van.sent
    parts = bundle.parts or []
    answer(requests, bundle, [p.reply(tensor=np.full(1, p.key, np.float32)) for p in parts])
    assert futures[1].cancelled()
    assert futures[0].result(0).tensor.tolist() == [1.0] and futures[2].result(0).tensor.tolist() == [3.0]


def test_call_together_fails_every_part_of_a_bundle_answered_wrong_or_refused_whole() -> None:
    van = FakeVan()
    requests = Requests(van)  # type: ignore[arg-type]
    futures = requests.call_together("gs", [push(1), push(2)])
    bundle = van.sent[-1][1]
    answer(requests, bundle, [(bundle.parts or [])[0].reply()])  # one answer for two parts
    for future in futures:
        with pytest.raises(RemoteError, match="answered a bundle of 2 requests with 1 answers"):
            future.result(0)
    futures = requests.call_together("gs", [push(1), push(2)])
    refusal = van.sent[-1][1].error("gs: 'w0' is not a client of this server")
    refusal.sender = b"gs"
    assert requests.resolve(refusal)
    for future in futures:
        with pytest.raises(RemoteError, match="not a client"):
            future.result(0)


def test_call_together_sends_a_single_push_as_a_plain_pushpull() -> None:
    van = FakeVan()
    requests = Requests(van)  # type: ignore[arg-type]
    (future,) = requests.call_together("gs", [push(1)])
    ((_, message),) = van.sent
    assert message.kind is Kind.PUSHPULL and message.parts is None
    reply = message.reply(tensor=np.ones(1, np.float32))
    reply.sender = b"gs"
    assert requests.resolve(reply) and isinstance(future, Future) and future.result(0).key == 1
