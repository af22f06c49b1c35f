"""The wire format: encode/decode round trips and strict rejection of malformed frames."""

from __future__ import annotations

import copy
import json
import pickle
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from geomx.protocol import wire
from geomx.protocol.wire import (
    MAX_BODY_BYTES,
    MAX_NDIM,
    PLUGIN_KINDS,
    PROTOCOL_VERSION,
    CodecId,
    Flag,
    Kind,
    Message,
    PluginKind,
    WireError,
    decode,
    encode,
    frames_nbytes,
)

ALL_DTYPES = [np.float32, np.float16, np.float64, np.int32, np.int64, np.uint8, np.int8]

HEADER = wire._HEADER  # the fixed header struct, used to forge malformed headers


def to_bytes(frames: list) -> list[bytes]:
    """What a receiver gets: independent byte buffers (no views into the sender's arrays)."""
    return [bytes(f) for f in frames]


def roundtrip(message: Message, **kwargs) -> Message:
    return decode(to_bytes(encode(message)), **kwargs)


def raw_header(*, magic=b"GX", version=PROTOCOL_VERSION, kind=int(Kind.PUSHPULL), flags=0, codec=0, dtype=1,
               ndim=None, priority=0, key=0, index=0, num_slices=1, request_id=0, round_=0, shape=(4,)) -> bytes:
    """A header with every field chosen by the caller (defaults: a valid float32 (4,) PUSHPULL)."""
    if ndim is None:
        ndim = len(shape)
    head = HEADER.pack(magic, version, kind, flags, codec, dtype, ndim, priority, key, index, num_slices,
                       request_id, round_)
    return head + struct.pack(f"<{len(shape)}Q", *shape)


def valid_frames() -> list[bytes]:
    return [raw_header(), b"", np.arange(4, dtype=np.float32).tobytes()]


# ---------------------------------------------------------------------------------------------------------
# Strategies

# the core's kinds and an algorithm's own, at both ends of the range reserved for them
# a BUNDLE carries messages, not a tensor of its own: tests/unit/test_wire_bundles.py
kinds = st.sampled_from([*(k for k in Kind if k is not Kind.BUNDLE), PluginKind(PLUGIN_KINDS.start, "test.first"),
                         PluginKind(PLUGIN_KINDS.stop - 1)])
reply_flags = st.sampled_from([Flag.NONE, Flag.REPLY])
keys = st.integers(-(2**63), 2**63 - 1)
priorities = st.integers(-(2**31), 2**31 - 1)
uint64s = st.integers(0, 2**64 - 1)


@st.composite
def index_and_count(draw):
    num_slices = draw(st.integers(1, 2**32 - 1))
    index = draw(st.integers(0, num_slices - 1))
    return index, num_slices


dtypes = st.sampled_from([np.dtype(d) for d in ALL_DTYPES])
# 1..4 dimensions, including zero-size ones (0-d is covered separately: see test_zero_dim_tensor_keeps_its_shape)
shapes = hnp.array_shapes(min_dims=1, max_dims=4, min_side=0, max_side=6)


@st.composite
def tensors(draw):
    dtype = draw(dtypes)
    shape = draw(shapes)
    return draw(hnp.arrays(dtype, shape))


json_scalars = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | \
    st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
json_objects = st.dictionaries(st.text(max_size=10), json_values, max_size=6)


def assert_header_fields_equal(got: Message, sent: Message) -> None:
    assert got.kind == sent.kind and type(got.kind) is type(sent.kind)  # a PluginKind decodes as a new int
    assert got.key == sent.key
    assert got.slice == sent.slice
    assert got.num_slices == sent.num_slices
    assert got.request_id == sent.request_id
    assert got.round == sent.round
    assert got.priority == sent.priority
    assert got.codec is CodecId.DENSE


# ---------------------------------------------------------------------------------------------------------
# Round trips


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=kinds, flags=reply_flags, key=keys, pc=index_and_count(), priority=priorities, request_id=uint64s,
       round_=uint64s, tensor=tensors())
def test_roundtrip_tensor_and_header_fields(kind, flags, key, pc, priority, request_id, round_, tensor):
    index, num_slices = pc
    sent = Message(kind, key=key, slice=index, num_slices=num_slices, request_id=request_id, round=round_,
                   priority=priority, flags=flags, tensor=tensor)
    got = roundtrip(sent)
    assert_header_fields_equal(got, sent)
    assert got.flags == flags  # REPLY kept, SHAPE_ONLY never set for a message with data
    assert got.is_reply == bool(flags & Flag.REPLY)
    assert got.body is None
    assert got.tensor is not None
    assert got.tensor.dtype == tensor.dtype
    assert got.dtype == tensor.dtype
    assert got.tensor.shape == tensor.shape
    assert got.shape == tensor.shape
    assert got.tensor.tobytes() == tensor.tobytes()  # bit-exact, NaNs and -0.0 included


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
def test_every_supported_dtype_travels(dtype):
    tensor = (np.arange(24) % 7).astype(dtype).reshape(2, 3, 4)
    got = roundtrip(Message(Kind.PUSHPULL, key=1, tensor=tensor))
    assert got.tensor.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got.tensor, tensor)


@pytest.mark.parametrize("dtype", [np.complex64, np.bool_, np.uint16, np.uint32, np.uint64])
def test_unsupported_dtype_refused_on_encode(dtype):
    with pytest.raises(WireError, match="cannot travel"):
        encode(Message(Kind.PUSHPULL, tensor=np.zeros(3, dtype=dtype)))
    with pytest.raises(WireError, match="cannot travel"):
        encode(Message(Kind.INIT, dtype=np.dtype(dtype), shape=(3,)))


def test_object_dtype_refused_on_encode_with_wire_error():
    with pytest.raises(WireError, match="cannot travel"):
        encode(Message(Kind.PUSHPULL, tensor=np.array([1, "a", None], dtype=object)))


@pytest.mark.parametrize("shape", [(0,), (0, 5), (3, 0, 2), (1, 1, 1, 0)])
def test_zero_size_tensor_roundtrip(shape):
    tensor = np.zeros(shape, np.float32)
    frames = encode(Message(Kind.PUSHPULL, tensor=tensor))
    assert len(frames) == 3 and len(bytes(frames[2])) == 0
    got = decode(to_bytes(frames))
    assert got.tensor.shape == shape and got.tensor.size == 0 and got.shape == shape


def test_non_contiguous_tensor_travels_in_logical_order():
    base = np.arange(12, dtype=np.float64).reshape(3, 4)
    view = base.T[::2]  # shape (2, 3), not contiguous
    got = roundtrip(Message(Kind.PUSHPULL, tensor=view))
    np.testing.assert_array_equal(got.tensor, view)


def test_decoded_tensor_is_a_read_only_zero_copy_view():
    data = np.arange(8, dtype=np.int64)
    frames = to_bytes(encode(Message(Kind.PUSHPULL, tensor=data)))
    got = decode(frames)
    assert not got.tensor.flags.writeable
    assert np.shares_memory(got.tensor, np.frombuffer(frames[2], dtype=np.uint8))


def test_encode_references_tensor_data_without_copying():
    data = np.arange(16, dtype=np.float32)
    frames = encode(Message(Kind.PUSHPULL, tensor=data))
    assert np.shares_memory(np.asarray(frames[2]), data)
    assert frames_nbytes(frames) == len(frames[0]) + len(frames[1]) + data.nbytes


def test_zero_dim_tensor_keeps_its_shape():
    got = roundtrip(Message(Kind.PUSHPULL, tensor=np.array(2.5, dtype=np.float32)))
    assert got.shape == ()
    assert got.tensor.shape == ()


@settings(max_examples=150, deadline=None)
@given(kind=kinds, body=json_objects, flags=reply_flags)
def test_body_json_roundtrip(kind, body, flags):
    got = roundtrip(Message(kind, body=body, flags=flags))
    assert got.body == body
    assert got.tensor is None and got.dtype is None and got.shape == ()
    assert got.flags == flags


def test_empty_body_is_none_but_empty_object_is_kept():
    assert roundtrip(Message(Kind.BARRIER)).body is None
    assert roundtrip(Message(Kind.BARRIER, body={})).body == {}


def test_body_and_tensor_together():
    body = {"error": "x", "n": [1, 2.5, None, True], "nested": {"ü": "ß"}}
    tensor = np.ones((2, 2), np.float16)
    got = roundtrip(Message(Kind.INIT, key=9, body=body, tensor=tensor))
    assert got.body == body
    np.testing.assert_array_equal(got.tensor, tensor)


def test_body_above_limit_refused_on_encode():
    with pytest.raises(WireError, match="exceeds"):
        encode(Message(Kind.REGISTER, body={"x": "a" * MAX_BODY_BYTES}))


@settings(max_examples=150, deadline=None)
@given(kind=kinds, dtype=dtypes, shape=hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=10**4),
       flags=reply_flags, key=keys)
def test_shape_only_roundtrip(kind, dtype, shape, flags, key):
    frames = encode(Message(kind, key=key, flags=flags, dtype=dtype, shape=shape))
    assert len(frames) == 2  # no data frame follows
    got = decode(to_bytes(frames), max_message_bytes=1 << 62)
    assert got.flags & Flag.SHAPE_ONLY
    assert bool(got.flags & Flag.REPLY) == bool(flags & Flag.REPLY)
    assert got.tensor is None
    assert got.dtype == dtype
    assert got.shape == tuple(shape)
    assert got.key == key


def test_shape_only_flag_dropped_when_tensor_present():
    tensor = np.ones(3, np.float32)
    got = roundtrip(Message(Kind.INIT, flags=Flag.SHAPE_ONLY, tensor=tensor))
    assert not got.flags & Flag.SHAPE_ONLY
    np.testing.assert_array_equal(got.tensor, tensor)


def test_reply_copies_request_identity():
    request = Message(Kind.PUSHPULL, key=5, slice=2, num_slices=3, request_id=77, round=4, priority=-1)
    reply = roundtrip(request.reply(tensor=np.zeros(2, np.float32)))
    assert reply.is_reply and reply.kind is Kind.PUSHPULL
    assert (reply.key, reply.slice, reply.num_slices, reply.request_id, reply.round, reply.priority) == \
        (5, 2, 3, 77, 4, -1)
    error = roundtrip(request.error("boom"))
    assert error.kind is Kind.ERROR and error.is_reply and error.body == {"error": "boom"}
    assert error.request_id == 77


def test_too_many_dimensions_refused_on_encode():
    with pytest.raises(WireError, match="dimensions"):
        encode(Message(Kind.PUSHPULL, tensor=np.zeros((1,) * (MAX_NDIM + 1), np.float32)))


def test_max_ndim_travels():
    tensor = np.zeros((1,) * MAX_NDIM, np.int8)
    assert roundtrip(Message(Kind.PUSHPULL, tensor=tensor)).shape == tensor.shape


# ---------------------------------------------------------------------------------------------------------
# Rejection of malformed input


def test_forged_valid_frames_decode():
    """Sanity check of the forging helper: with no field changed, the frames are accepted."""
    got = decode(valid_frames())
    np.testing.assert_array_equal(got.tensor, np.arange(4, dtype=np.float32))


@pytest.mark.parametrize("frames", [[], [raw_header()]], ids=["no frames", "header only"])
def test_too_few_frames(frames):
    with pytest.raises(WireError, match="at least 2 frames"):
        decode(frames)


@pytest.mark.parametrize("length", [0, 1, 10, HEADER.size - 1])
def test_truncated_header(length):
    frames = valid_frames()
    frames[0] = frames[0][:length]
    with pytest.raises(WireError, match="shorter"):
        decode(frames)


def test_header_cut_inside_the_dimensions():
    frames = valid_frames()
    frames[0] = frames[0][:-3]
    with pytest.raises(WireError, match="header is"):
        decode(frames)


@pytest.mark.parametrize("magic", [b"XG", b"\0\0", b"gx"])
def test_bad_magic(magic):
    with pytest.raises(WireError, match="magic"):
        decode([raw_header(magic=magic), b"", bytes(16)])


@pytest.mark.parametrize("version", [0, PROTOCOL_VERSION + 1, 255])
def test_wrong_version(version):
    with pytest.raises(WireError, match="version"):
        decode([raw_header(version=version), b"", bytes(16)])


@pytest.mark.parametrize("kind", [0, max(Kind) + 1, PLUGIN_KINDS.start - 1])
def test_unknown_kind(kind):
    """Neither a core kind nor in the algorithms' range: refused, naming the number."""
    with pytest.raises(WireError, match=f"unknown message kind {kind}$"):
        decode([raw_header(kind=kind), b"", bytes(16)])


@pytest.mark.parametrize("number", [PLUGIN_KINDS.start, 100, PLUGIN_KINDS.stop - 1])
def test_a_plugin_kind_round_trips_and_finds_its_handler(number):
    declared = PluginKind(number, "test.overlay")
    got = roundtrip(Message(declared, key=5, body={"ask": True}, tensor=np.ones(3, np.float32)))
    assert isinstance(got.kind, PluginKind) and not isinstance(got.kind, Kind)
    assert got.kind == declared and got.kind.name == f"kind {number}"  # the wire carries no name
    assert {declared: "on_overlay"}[got.kind] == "on_overlay"  # a handler table keyed by the declared kind
    assert (got.key, got.body, got.tensor.tolist()) == (5, {"ask": True}, [1, 1, 1])
    assert got.reply().kind == declared and got.error("no").kind is Kind.ERROR


@pytest.mark.parametrize("number", [-1, 0, int(Kind.PUSHPULL), PLUGIN_KINDS.start - 1, PLUGIN_KINDS.stop, 1 << 40])
def test_a_plugin_kind_outside_its_range_is_refused(number):
    span = rf"{PLUGIN_KINDS.start}\.\.{PLUGIN_KINDS.stop - 1}"
    with pytest.raises(ValueError, match=rf"plugin message kind {number} \(test.bad\) is outside {span}"):
        PluginKind(number, "test.bad")


def test_a_plugin_kind_is_its_number_with_a_name():
    kind = PluginKind(40, "test.overlay")
    assert kind == 40 and hash(kind) == hash(40) and f"{kind}" == "40" and kind.name == "test.overlay"
    assert repr(kind) == "PluginKind(40, 'test.overlay')"
    for twin in (copy.deepcopy(kind), pickle.loads(pickle.dumps(kind))):
        assert type(twin) is PluginKind and twin == kind and twin.name == "test.overlay"
    with pytest.raises(ValueError, match="not True"):
        PluginKind(True)


def test_two_plugin_kinds_sharing_a_number_are_refused():
    wire.check_plugin_kinds([PluginKind(32, "a.one"), PluginKind(33, "b.one"), PluginKind(32, "a.one")])
    with pytest.raises(ValueError, match=r"'a\.one' and 'b\.two' share the number 32"):
        wire.check_plugin_kinds([PluginKind(32, "a.one"), PluginKind(33, "b.one"), PluginKind(32, "b.two")])


@pytest.mark.parametrize("kind", [32, 3, None])
def test_encode_refuses_a_kind_that_is_neither_a_kind_nor_a_plugin_kind(kind):
    with pytest.raises(WireError, match="neither a Kind nor a PluginKind"):
        encode(Message(kind))


@pytest.mark.parametrize("flags", [4, 8, 0x80, 0xFF])
def test_unknown_flag(flags):
    with pytest.raises(WireError, match="flag"):
        decode([raw_header(flags=flags), b"", bytes(16)])


@pytest.mark.parametrize("codec", [64, 255])
def test_unknown_codec(codec):
    with pytest.raises(WireError, match="codec"):
        decode([raw_header(codec=codec), b"", bytes(16)])


def test_encoded_payload_round_trip():
    """A codec's frames travel raw with the decoded tensor's dtype and shape; meta rides in the body."""
    values = np.arange(5, dtype=np.float16)
    indices = np.array([1, 7, 9], np.int32)
    message = Message(Kind.PUSHPULL, key=3, codec=2, encoded=[values, indices], dtype=np.dtype(np.float32),
                      shape=(100,), body={wire.CODEC_META: {"k": 3}})
    got = decode(encode(message))
    assert got.codec == 2 and got.tensor is None
    assert got.dtype == np.float32 and got.shape == (100,)
    assert got.body == {wire.CODEC_META: {"k": 3}}
    assert [bytes(f) for f in got.encoded] == [values.tobytes(), indices.tobytes()]


@pytest.mark.parametrize("frames", [
    [raw_header(codec=2), b""],                                   # no payload frame
    [raw_header(codec=2, flags=int(Flag.SHAPE_ONLY)), b"", b"x"],  # shape-only and frames
    [raw_header(codec=2, dtype=0, shape=()), b"", b"x"],          # no dtype
    [raw_header(codec=2), b"", *([b"x"] * 9)],                    # too many frames
])
def test_malformed_encoded_payloads(frames):
    with pytest.raises(WireError, match="codec 2"):
        decode(frames)


@pytest.mark.parametrize("code", [8, 99, 255])
def test_unknown_dtype(code):
    with pytest.raises(WireError, match="dtype"):
        decode([raw_header(dtype=code), b"", bytes(16)])


def test_ndim_too_large():
    shape = (1,) * (MAX_NDIM + 1)
    with pytest.raises(WireError, match="ndim"):
        decode([raw_header(shape=shape), b"", bytes(4)])


@pytest.mark.parametrize("ndim", [0, 2, 5])
def test_header_length_does_not_match_ndim(ndim):
    # the header carries one dimension (4,) but declares another ndim
    with pytest.raises(WireError, match="header is"):
        decode([raw_header(ndim=ndim, shape=(4,)), b"", bytes(16)])


def test_trailing_bytes_after_header():
    with pytest.raises(WireError, match="header is"):
        decode([raw_header() + b"\0", b"", bytes(16)])


@pytest.mark.parametrize("index,num_slices", [(0, 0), (1, 1), (5, 3), (2**32 - 1, 2**32 - 1)])
def test_slice_not_below_num_slices(index, num_slices):
    with pytest.raises(WireError, match="slice"):
        decode([raw_header(index=index, num_slices=num_slices), b"", bytes(16)])


@pytest.mark.parametrize("length", [0, 15, 17, 32])
def test_data_frame_of_wrong_length(length):
    with pytest.raises(WireError, match="data frame holds"):
        decode([raw_header(), b"", bytes(length)])


def test_missing_data_frame():
    with pytest.raises(WireError, match="exactly 1 data frame"):
        decode([raw_header(), b""])


def test_extra_data_frame():
    with pytest.raises(WireError, match="exactly 1 data frame"):
        decode([raw_header(), b"", bytes(16), bytes(16)])


def test_shape_only_with_data_frame():
    with pytest.raises(WireError, match="SHAPE_ONLY"):
        decode([raw_header(flags=int(Flag.SHAPE_ONLY)), b"", bytes(16)])


@pytest.mark.parametrize("frames", [
    [raw_header(dtype=0, shape=()), b"", b""],
    [raw_header(dtype=0, shape=(4,)), b""],
], ids=["data without dtype", "shape without dtype"])
def test_no_dtype_means_no_shape_and_no_data(frames):
    with pytest.raises(WireError, match="without dtype"):
        decode(frames)


@pytest.mark.parametrize("body", [b"{", b"not json", b"\xff\xfe\xfa", b"{'a': 1}", b"{\"a\": 1} trailing"])
def test_body_not_json(body):
    with pytest.raises(WireError, match="JSON"):
        decode([raw_header(), body, bytes(16)])


@pytest.mark.parametrize("body", [b"[]", b"[1, 2]", b"3", b"\"text\"", b"null", b"true"])
def test_body_not_an_object(body):
    with pytest.raises(WireError, match="object"):
        decode([raw_header(), body, bytes(16)])


def test_body_frame_above_limit():
    body = b'{"a":"' + b"x" * MAX_BODY_BYTES + b'"}'
    with pytest.raises(WireError, match="exceeds"):
        decode([raw_header(), body, bytes(16)])


def test_declared_size_above_max_message_bytes():
    tensor = np.zeros(100, np.float32)  # 400 bytes
    frames = to_bytes(encode(Message(Kind.PUSHPULL, tensor=tensor)))
    assert decode(frames, max_message_bytes=400).tensor.shape == (100,)
    with pytest.raises(WireError, match="above the limit"):
        decode(frames, max_message_bytes=399)


def test_shape_only_declaring_huge_size_is_refused():
    """A SHAPE_ONLY header cannot smuggle an absurd size past the limit (there is no data to check)."""
    header = raw_header(flags=int(Flag.SHAPE_ONLY), dtype=5, shape=(2**40, 2**20))
    with pytest.raises(WireError, match="above the limit"):
        decode([header, b""])
    with pytest.raises(WireError, match="above the limit"):
        decode(to_bytes(encode(Message(Kind.INIT, dtype=np.float32, shape=(1 << 30,)))), max_message_bytes=1 << 20)


def test_frame_that_is_not_a_buffer():
    with pytest.raises(WireError, match="not a buffer"):
        decode([raw_header(), 12345, bytes(16)])


def test_zero_size_shape_with_huge_dimension_is_a_wire_error():
    header = raw_header(dtype=1, shape=(0, 2**62))
    with pytest.raises(WireError):
        decode([header, b"", b""])


def test_deeply_nested_body_is_a_wire_error():
    with pytest.raises(WireError):
        decode([raw_header(), b"[" * 100_000, bytes(16)])


def test_huge_integer_in_body_is_a_wire_error():
    body = b'{"n": ' + b"9" * 5000 + b"}"
    with pytest.raises(WireError):
        decode([raw_header(), body, bytes(16)])


# ---------------------------------------------------------------------------------------------------------
# Fuzzing: nothing but WireError, ever


@settings(max_examples=500, deadline=None)
@given(st.lists(st.binary(max_size=80), max_size=5))
def test_random_frames_raise_only_wire_error(frames):
    try:
        message = decode(frames)
    except WireError:
        return
    assert isinstance(message, Message)  # pragma: no cover - random bytes almost never form a message


@st.composite
def plausible_frames(draw):
    """Frames with a well-formed fixed header but arbitrary field values, so decode goes past the magic.

    Dimensions stay small (<= 64): huge dimensions hit the numpy bug pinned by
    test_zero_size_shape_with_huge_dimension_is_a_wire_error.
    """
    ndim = draw(st.integers(0, 10))
    shape = draw(st.lists(st.integers(0, 64), min_size=ndim, max_size=ndim))
    header = HEADER.pack(
        b"GX", draw(st.sampled_from([PROTOCOL_VERSION, PROTOCOL_VERSION, 0, PROTOCOL_VERSION + 1])),
        draw(st.integers(0, max(Kind) + 1) | st.sampled_from([PLUGIN_KINDS.start - 1, PLUGIN_KINDS.start, 255])),
        draw(st.integers(0, 7)), draw(st.integers(0, 1)), draw(st.integers(0, 9)),
        draw(st.integers(0, 10)), draw(st.integers(-(2**31), 2**31 - 1)), draw(keys),
        draw(st.integers(0, 4)), draw(st.integers(0, 4)), draw(uint64s), draw(uint64s),
    ) + struct.pack(f"<{ndim}Q", *shape)
    if draw(st.booleans()):
        header = header[:draw(st.integers(0, len(header)))]
    body = draw(st.sampled_from([b"", b"{}", b'{"a": [1, 2]}', b"[]", b"{"]) | st.binary(max_size=30))
    data = draw(st.lists(st.binary(max_size=64) | st.sampled_from([bytes(4 * n) for n in range(0, 9)]),
                         max_size=3))
    return [header, body, *data]


@settings(max_examples=400, deadline=None)
@given(plausible_frames())
def test_plausible_frames_raise_only_wire_error(frames):
    try:
        message = decode(frames)
    except WireError:
        return
    # accepted: then it must be self-consistent and re-encode to the same fixed header
    assert isinstance(message.kind, (Kind, PluginKind))
    if message.tensor is not None:
        assert message.tensor.nbytes == len(frames[2])
    assert bytes(encode(message)[0]) == bytes(frames[0])


def test_body_is_never_unpickled():
    """The body is JSON, never pickle: a pickle payload is simply invalid."""
    import pickle

    with pytest.raises(WireError):
        decode([raw_header(), pickle.dumps({"a": 1}), bytes(16)])
    assert json.loads(bytes(encode(Message(Kind.STATS, body={"a": 1}))[1])) == {"a": 1}
