"""Property tests of what a server does with bytes from the network: mutate valid messages (and codec
payloads) every way a broken or hostile peer could, and check that the only exceptions are the decoders'
own (``WireError`` for the wire, ``CodecError`` for codec payloads), and that nothing accepted declares
more bytes than the limit. (``test_wire.py`` has the round trips and random-frame tests.)"""

from __future__ import annotations

import math
import struct

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from geomx.codecs import CodecError, TensorInfo, default_registry
from geomx.codecs.messages import decode_message, payload_fields
from geomx.protocol.wire import PLUGIN_KINDS, Kind, Message, PluginKind, WireError, decode, encode

LIMIT = 1 << 16
HEADER_FIXED = 44  # bytes before the dimensions (see wire._HEADER)

# bundles of these: tests/unit/test_wire_bundles.py
kinds = st.sampled_from([*(k for k in Kind if k is not Kind.BUNDLE), PluginKind(PLUGIN_KINDS.start, "fuzz.first"),
                         PluginKind(PLUGIN_KINDS.stop - 1)])
tensors = hnp.arrays(st.sampled_from([np.float32, np.float16, np.int64, np.uint8]),
                     hnp.array_shapes(min_dims=0, max_dims=3, max_side=6))
bodies = st.none() | st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5), max_size=3)


@st.composite
def messages(draw: st.DrawFn) -> Message:
    """A valid message: any kind, key, slice, request id, round, priority, tensor (or none) and JSON body."""
    num_slices = draw(st.integers(1, 2**16))
    return Message(draw(kinds), key=draw(st.integers(0, 2**40)), slice=draw(st.integers(0, num_slices - 1)),
                   num_slices=num_slices, request_id=draw(st.integers(0, 2**64 - 1)),
                   round=draw(st.integers(0, 2**64 - 1)), priority=draw(st.integers(-2**31, 2**31 - 1)),
                   tensor=draw(st.none() | tensors), body=draw(bodies))


def frames_of(message: Message) -> list[bytes]:
    return [bytes(memoryview(f)) for f in encode(message)]


def valid_messages() -> st.SearchStrategy[list[bytes]]:
    return messages().map(frames_of)


@st.composite
def mutated(draw: st.DrawFn, source: st.SearchStrategy[list[bytes]]) -> list[bytes]:
    frames = list(draw(source))
    for _ in range(draw(st.integers(1, 4))):
        how = draw(st.integers(0, 6))
        index = draw(st.integers(0, len(frames) - 1)) if frames else 0
        if how == 0 and frames and frames[index]:  # flip bytes
            data = bytearray(frames[index])
            for _ in range(draw(st.integers(1, 4))):
                data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
            frames[index] = bytes(data)
        elif how == 1 and frames:  # truncate
            frames[index] = frames[index][:draw(st.integers(0, len(frames[index])))]
        elif how == 2 and frames:  # extend
            frames[index] = frames[index] + draw(st.binary(min_size=1, max_size=64))
        elif how == 3 and frames:  # drop a frame
            del frames[index]
        elif how == 4:  # insert a frame
            frames.insert(index, draw(st.binary(max_size=64)))
        elif how == 5 and frames and len(frames[0]) >= HEADER_FIXED:  # overwrite a header word (or a dimension)
            header = bytearray(frames[0])
            offset = draw(st.integers(0, (len(header) - 8) // 8)) * 8 if len(header) >= 8 else 0
            header[offset:offset + 8] = struct.pack("<Q", draw(st.sampled_from(
                [0, 1, 2**31, 2**32 - 1, 2**40, 2**62, 2**64 - 1]) | st.integers(0, 2**64 - 1)))
            frames[0] = bytes(header[:len(frames[0])])
        elif how == 6 and frames:  # duplicate
            frames.insert(index, frames[index])
    return frames


def check_decode(frames: list[bytes]) -> None:
    try:
        message = decode(frames, max_message_bytes=LIMIT)
    except WireError:
        return
    assert isinstance(message.kind, (Kind, PluginKind))
    declared = math.prod(message.shape) * (message.dtype.itemsize if message.dtype is not None else 0)
    assert declared <= LIMIT, (message.shape, message.dtype)
    if message.tensor is not None:
        assert message.tensor.nbytes == declared


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated(valid_messages()))
def test_mutated_messages_raise_only_wire_error(frames: list[bytes]) -> None:
    check_decode(frames)


@settings(max_examples=50, deadline=None)
@given(messages())
def test_valid_messages_still_decode(sent: Message) -> None:
    """The round trip gives back every field that was sent: kind, key, slice, ids, body, the tensor's bytes."""
    got = decode(frames_of(sent))
    for name in ("kind", "key", "slice", "num_slices", "request_id", "round", "priority", "flags", "codec", "body"):
        assert getattr(got, name) == getattr(sent, name), (name, getattr(got, name), getattr(sent, name))
    if sent.tensor is None:
        assert got.tensor is None
        return
    assert got.tensor is not None
    assert (got.tensor.dtype, got.tensor.shape) == (sent.tensor.dtype, sent.tensor.shape)
    assert got.tensor.tobytes() == sent.tensor.tobytes()  # bit for bit (NaNs included)


@st.composite
def codec_payloads(draw: st.DrawFn) -> list[bytes]:
    """A local server's compressed push: fp16, int8, Bi-Sparse or sparse 2-bit over a small float32 tensor."""
    spec = draw(st.sampled_from([{"type": "fp16"}, {"type": "int8"},
                                 {"type": "bsc", "threshold": 0.5, "size_lower_bound": 0},
                                 {"type": "sparse2bit", "density": 0.2, "chunk": 8}]))
    array = draw(hnp.arrays(np.float32, st.integers(1, 40), elements=st.floats(-4, 4, width=32)))
    codec = default_registry().make_codec(spec)
    fields = payload_fields(codec, array, TensorInfo(0, 0, "gradient", "push"))
    return [bytes(memoryview(f)) for f in encode(Message(Kind.PUSHPULL, **fields))]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated(codec_payloads()))
def test_mutated_codec_payloads_raise_only_decoder_errors(frames: list[bytes]) -> None:
    """What the server does with a PUSHPULL: wire.decode, then the codec registry's decode."""
    try:
        message = decode(frames, max_message_bytes=LIMIT)
    except WireError:
        return
    try:
        dense = decode_message(default_registry(), message)
    except CodecError:
        return
    if dense is not None:
        assert tuple(dense.shape) == tuple(message.shape)


def test_codec_payload_declaring_a_huge_decoded_size_is_refused_before_decoding() -> None:
    """Compressed frames are small, but the decoded tensor is allocated from the header's shape."""
    fields = payload_fields(default_registry().make_codec({"type": "fp16"}), np.ones(8, np.float32),
                            TensorInfo(0, 0, "gradient", "push"))
    frames = [bytes(memoryview(f)) for f in encode(Message(Kind.PUSHPULL, **fields))]
    header = bytearray(frames[0])
    header[-8:] = struct.pack("<Q", LIMIT)  # LIMIT float32 elements = 4 x LIMIT bytes
    try:
        decode([bytes(header), *frames[1:]], max_message_bytes=LIMIT)
    except WireError as exc:
        assert "decoded bytes, above the limit" in str(exc)
    else:
        raise AssertionError("a codec payload declaring 4x the limit was accepted")
