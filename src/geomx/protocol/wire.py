"""The wire format: one small fixed header, an optional JSON body, and raw tensor frames.

A message travels as ZeroMQ frames ``[header, body, *data]``:

* ``header`` — a packed struct (see ``_HEADER``) with a version byte, one kind, flags, the codec id,
  the tensor's dtype and shape, the key and its slice (``slice`` of ``num_slices``), the request id, the
  round number and the priority; followed by ``ndim`` little-endian uint64 dimensions.
* ``body`` — UTF-8 JSON for control messages (registration, optimizer specs, errors), or empty.
  Never pickle: nothing on the wire is executable.
* ``data`` — for codec ``DENSE``: exactly one frame of ``prod(shape) * itemsize`` bytes, decoded
  without a copy (a read-only NumPy view of the received buffer).

A message's kind is one of the core's (``Kind``: registration, pushes, pulls, …) or one an algorithm declares
for itself (``PluginKind``, numbered in ``PLUGIN_KINDS``): this layer knows no algorithm, only which numbers are
theirs (``geomx.protocol.kinds``). Every field is validated on decode; anything wrong raises ``WireError`` naming
the field.

A ``BUNDLE`` carries several PUSHPULLs for one server as one message (or, flagged ``REPLY``, their answers, each
a PUSHPULL answer or an ERROR): its header has no tensor, its body is ``{"parts": [n0, n1, ...]}`` (each part's
frame count) and its data frames are the parts' own frames, each part the message it would be alone but for its
header, which is compact (``geomx.protocol.compact``: 13-16 bytes, not 52, for a part of a model's round). At
most ``MAX_BUNDLE_PARTS`` parts; no bundle inside a bundle. ``bundled`` cuts a sender's messages into bundles of
at most ``MAX_BUNDLE_BYTES`` of payload each (a larger message travels alone).

Usage::

    frames = encode(Message(Kind.PUSHPULL, key=3, tensor=np.ones(4, np.float32)))
    message = decode(frames)
    MINE = PluginKind(40, "myalgo.mine")               # in an algorithm's folder: geomx.algorithms.myalgo.kinds
    assert decode(encode(Message(MINE))).kind == MINE  # ==, never ``is``: decoded, it is a new int
    decode(encode(Message(Kind.BUNDLE, parts=[push0, push1]))).parts     # [push0, push1], decoded
"""

from __future__ import annotations

import enum
import json
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .compact import CompactError, compact, expand
from .kinds import PLUGIN_KINDS, Kind, MessageKind, PluginKind
from .kinds import check_plugin_kinds as check_plugin_kinds  # re-exported: the kinds' home is kinds.py

# 2: the algorithms' kinds moved out of Kind into PLUGIN_KINDS; 3: Kind.BUNDLE; 4: a bundle's parts' compact headers
PROTOCOL_VERSION = 4
MAX_NDIM = 8
MAX_BODY_BYTES = 1 << 20

# A slice of a key's tensor, ``(key, index)``: the unit that travels, is summed and is checkpointed. Every layer
# names it with this one type.
SliceId = tuple[int, int]


class WireError(ValueError):
    """A frame sequence that is not a valid geomx message."""


class Flag(enum.IntFlag):
    NONE = 0
    REPLY = 1  # this answers request_id
    SHAPE_ONLY = 2  # dtype and shape are set but no data frame follows (e.g. a non-master INIT)


class CodecId(enum.IntEnum):
    """How the data frames encode the tensor. DENSE is decoded here; any other id (1..MAX_CODEC_ID) names a
    codec of ``geomx.codecs``: its frames stay raw bytes (``Message.encoded``) for the receiver's codec
    registry, with the codec's small meta in the JSON body under ``CODEC_META``."""

    DENSE = 0


MAX_CODEC_ID = 63
MAX_ENCODED_FRAMES = 8
CODEC_META = "codec_meta"


# dtype code <-> numpy dtype. Code 0 means "no tensor".
_DTYPES: dict[int, np.dtype[Any]] = {
    1: np.dtype(np.float32),
    2: np.dtype(np.float16),
    3: np.dtype(np.float64),
    4: np.dtype(np.int32),
    5: np.dtype(np.int64),
    6: np.dtype(np.uint8),
    7: np.dtype(np.int8),
}
_DTYPE_CODES = {dtype: code for code, dtype in _DTYPES.items()}

# magic, version, kind, flags, codec, dtype, ndim, priority, key, slice, num_slices, request_id, round
_HEADER = struct.Struct("<2sBBBBBBiqIIQQ")
_MAGIC = b"GX"
# the per-message paths look numbers up instead of calling the enums (an enum call or a Flag operator is a few
# microseconds of Python each, paid several times per message on every node)
_CORE_KINDS = {int(kind): kind for kind in Kind}
_REPLY, _SHAPE_ONLY = int(Flag.REPLY), int(Flag.SHAPE_ONLY)
_KNOWN_FLAGS = _REPLY | _SHAPE_ONLY
_FLAGS = {bits: Flag(bits) for bits in range(_KNOWN_FLAGS + 1)}


def dtype_code(dtype: np.dtype[Any]) -> int:
    try:
        return _DTYPE_CODES[np.dtype(dtype)]
    except KeyError:
        raise WireError(f"dtype {dtype} cannot travel; supported: {[str(d) for d in _DTYPES.values()]}") from None


@dataclass
class Message:
    """One decoded message. ``tensor`` may be a read-only view into the received buffer."""

    kind: MessageKind
    key: int = 0
    slice: int = 0
    num_slices: int = 1
    request_id: int = 0
    round: int = 0
    priority: int = 0
    flags: Flag = Flag.NONE
    codec: int = CodecId.DENSE
    body: dict[str, Any] | None = None
    tensor: np.ndarray | None = None
    encoded: list[np.ndarray] | None = None  # a non-DENSE codec's frames (raw bytes; dtype/shape: the decoded)
    dtype: np.dtype[Any] | None = None  # set with SHAPE_ONLY (and mirrors tensor.dtype otherwise)
    shape: tuple[int, ...] = ()
    sender: bytes = field(default=b"", compare=False)
    parts: list[Message] | None = None  # a BUNDLE's: its PUSHPULLs (a request's) or their answers (a reply's)

    @property
    def is_reply(self) -> bool:
        return bool(int(self.flags) & _REPLY)

    def reply(self, kind: MessageKind | None = None, **fields: Any) -> Message:
        """A reply to this request: same key/slice/request id/round, REPLY flag set."""
        base: dict[str, Any] = {"kind": kind or self.kind, "key": self.key, "slice": self.slice,
                                "num_slices": self.num_slices, "request_id": self.request_id,
                                "round": self.round, "priority": self.priority, "flags": Flag.REPLY}
        base.update(fields)
        return Message(**base)

    def error(self, text: str) -> Message:
        return self.reply(Kind.ERROR, body={"error": text})


def encode(message: Message) -> list[bytes | memoryview]:
    """Frames for ``message``. Tensor data is referenced, not copied: keep it alive and unchanged until sent."""
    if message.kind is Kind.BUNDLE:
        return _encode_bundle(message)
    data: list[bytes | memoryview]
    flags = int(message.flags)
    if not isinstance(message.kind, (Kind, PluginKind)):
        raise WireError(f"message kind {message.kind!r} is neither a Kind nor a PluginKind")
    if message.encoded is not None:
        if not 0 < message.codec <= MAX_CODEC_ID:
            raise WireError(f"encoded frames need a codec id in 1..{MAX_CODEC_ID}, got {message.codec}")
        if message.dtype is None or not 1 <= len(message.encoded) <= MAX_ENCODED_FRAMES:
            raise WireError(f"an encoded tensor needs its dtype and 1..{MAX_ENCODED_FRAMES} frames")
        dtype = np.dtype(message.dtype)
        shape = tuple(message.shape)
        flags &= ~_SHAPE_ONLY
        data = [memoryview(np.ascontiguousarray(f).reshape(-1).view(np.uint8))  # type: ignore[arg-type]
                for f in message.encoded]
    elif message.tensor is not None:
        array = message.tensor if message.tensor.flags.c_contiguous else message.tensor.copy(order="C")
        dtype = array.dtype
        shape = array.shape
        dtype_code(dtype)  # refuse dtypes that cannot travel before touching the data
        flags &= ~_SHAPE_ONLY
        data = [memoryview(array.reshape(-1).view(np.uint8))]  # type: ignore[arg-type]
    elif message.dtype is not None:
        dtype = np.dtype(message.dtype)
        shape = tuple(message.shape)
        flags |= _SHAPE_ONLY
        data = []
    else:
        dtype = None
        shape = ()
        data = []
    if len(shape) > MAX_NDIM:
        raise WireError(f"tensor has {len(shape)} dimensions; at most {MAX_NDIM} travel")
    code = dtype_code(dtype) if dtype is not None else 0
    header = _HEADER.pack(_MAGIC, PROTOCOL_VERSION, int(message.kind), flags, int(message.codec), code,
                          len(shape), message.priority, message.key, message.slice, message.num_slices,
                          message.request_id, message.round)
    header += struct.pack(f"<{len(shape)}Q", *shape)
    body = b"" if message.body is None else json.dumps(message.body, separators=(",", ":")).encode()
    if len(body) > MAX_BODY_BYTES:
        raise WireError(f"JSON body of {len(body)} bytes exceeds the limit of {MAX_BODY_BYTES}")
    return [header, body, *data]


def _buffer(frame: Any) -> memoryview:
    """A memoryview of a zmq Frame, bytes or memoryview, without copying."""
    if isinstance(frame, memoryview):
        return frame
    if isinstance(frame, (bytes, bytearray)):
        return memoryview(frame)
    buffer = getattr(frame, "buffer", None)
    if buffer is not None:
        return memoryview(buffer)
    raise WireError(f"frame of type {type(frame).__name__} is not a buffer")


def decode(frames: Sequence[Any], max_message_bytes: int = 1 << 31, _inside: bool = False) -> Message:
    """Parse and validate frames into a Message; raises WireError saying what is wrong."""
    if len(frames) < 2:
        raise WireError(f"a message has at least 2 frames (header, body), got {len(frames)}")
    header = _buffer(frames[0])
    if len(header) < _HEADER.size:
        raise WireError(f"header of {len(header)} bytes is shorter than the fixed {_HEADER.size}")
    (magic, version, kind, flags, codec, code, ndim, priority, key, index, num_slices, request_id,
     round_) = _HEADER.unpack_from(header, 0)
    if magic != _MAGIC:
        raise WireError(f"bad magic {bytes(magic)!r}; not a geomx message")
    if version != PROTOCOL_VERSION:
        raise WireError(f"protocol version {version} is not supported (this node speaks {PROTOCOL_VERSION})")
    kind_value: MessageKind | None = _CORE_KINDS.get(kind)
    if kind_value is None:
        if kind not in PLUGIN_KINDS:
            raise WireError(f"unknown message kind {kind}")
        kind_value = PluginKind(kind)  # unnamed: which algorithm's it is, the receiver's handlers know
    if flags & ~_KNOWN_FLAGS:
        raise WireError(f"unknown flag bits {flags:#x}")
    if codec > MAX_CODEC_ID:
        raise WireError(f"unknown codec id {codec}")
    if ndim > MAX_NDIM:
        raise WireError(f"ndim {ndim} exceeds {MAX_NDIM}")
    if len(header) != _HEADER.size + 8 * ndim:
        raise WireError(f"header is {len(header)} bytes; ndim={ndim} needs {_HEADER.size + 8 * ndim}")
    shape = struct.unpack_from(f"<{ndim}Q", header, _HEADER.size)
    if num_slices < 1 or index >= num_slices:
        raise WireError(f"slice {index} of {num_slices} is impossible")
    body_frame = _buffer(frames[1])
    if len(body_frame) > MAX_BODY_BYTES:
        raise WireError(f"JSON body of {len(body_frame)} bytes exceeds {MAX_BODY_BYTES}")
    body: dict[str, Any] | None = None
    if len(body_frame):
        try:
            body = json.loads(bytes(body_frame))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
            raise WireError(f"body is not valid JSON: {type(exc).__name__}: {str(exc)[:200]}") from None
        if not isinstance(body, dict):
            raise WireError("body must be a JSON object")
    if kind_value is Kind.BUNDLE:
        if _inside:
            raise WireError("a bundle inside a bundle")
        if codec or code or ndim or key or index or round_:
            raise WireError("a bundle's header carries no tensor, key, slice or round of its own")
        parts = _decode_parts(body, frames[2:], bool(flags & _REPLY), max_message_bytes)
        return Message(Kind.BUNDLE, request_id=request_id, priority=priority, flags=_FLAGS[flags], parts=parts)
    dtype: np.dtype[Any] | None = None
    tensor: np.ndarray | None = None
    encoded: list[np.ndarray] | None = None
    data_frames = frames[2:]
    if codec != CodecId.DENSE:
        if code not in _DTYPES or flags & _SHAPE_ONLY:
            raise WireError(f"codec {codec} payload needs a known dtype and data frames")
        if not 1 <= len(data_frames) <= MAX_ENCODED_FRAMES:
            raise WireError(f"codec {codec} payload has {len(data_frames)} frames; 1..{MAX_ENCODED_FRAMES} allowed")
        dtype = _DTYPES[code]
        decoded_nbytes = math.prod(shape) * dtype.itemsize  # what the codec will allocate: check it first
        if any(dim > max_message_bytes for dim in shape) or decoded_nbytes > max_message_bytes:
            raise WireError(f"shape {tuple(shape)} of {dtype} declares {decoded_nbytes} decoded bytes, above the "
                            f"limit {max_message_bytes}")
        encoded = [np.frombuffer(_buffer(f), dtype=np.uint8) for f in data_frames]
    elif code == 0:
        if ndim or data_frames:
            raise WireError("a message without dtype carries no shape and no data")
    else:
        if code not in _DTYPES:
            raise WireError(f"unknown dtype code {code}")
        dtype = _DTYPES[code]
        count = math.prod(shape)
        nbytes = count * dtype.itemsize
        if any(dim > max_message_bytes for dim in shape):
            raise WireError(f"shape {tuple(shape)} has a dimension above the limit {max_message_bytes}")
        if nbytes > max_message_bytes:
            raise WireError(f"shape {tuple(shape)} declares {nbytes} bytes, above the limit {max_message_bytes}")
        if flags & _SHAPE_ONLY:
            if data_frames:
                raise WireError("SHAPE_ONLY message carries data frames")
        else:
            if len(data_frames) != 1:
                raise WireError(f"dense tensor needs exactly 1 data frame, got {len(data_frames)}")
            buffer = _buffer(data_frames[0])
            if len(buffer) != nbytes:
                raise WireError(f"data frame holds {len(buffer)} bytes; shape {tuple(shape)} of {dtype} "
                                f"needs {nbytes}")
            tensor = np.frombuffer(buffer, dtype=dtype, count=count).reshape(shape)
    return Message(kind=kind_value, key=key, slice=index, num_slices=num_slices, request_id=request_id,
                   round=round_, priority=priority, flags=_FLAGS[flags],
                   codec=CodecId.DENSE if codec == CodecId.DENSE else codec, body=body,
                   tensor=tensor, dtype=dtype, shape=tuple(shape), encoded=encoded)


def frames_nbytes(frames: Sequence[Any]) -> int:
    """Total payload bytes of a frame list (what the byte counters count)."""
    return sum(len(_buffer(f)) for f in frames)


MAX_BUNDLE_PARTS = 1024
MAX_BUNDLE_BYTES = 1 << 20  # a bundle's payload, as ``bundled`` cuts them (a larger message travels alone)
BUNDLE_PARTS = "parts"  # a bundle's body: each part's frame count, in order


def payload_nbytes(message: Message) -> int:
    """The bytes of ``message``'s tensor or encoded frames (0 for none)."""
    if message.encoded is not None:
        return sum(frame.nbytes for frame in message.encoded)
    return 0 if message.tensor is None else int(message.tensor.nbytes)


def bundled(messages: Sequence[Message], max_bytes: int = MAX_BUNDLE_BYTES,
            max_parts: int = MAX_BUNDLE_PARTS) -> list[list[Message]]:
    """``messages`` in order, cut into runs of at most ``max_parts`` messages and ``max_bytes`` of payload each
    (a message larger than ``max_bytes`` is a run of its own): each run of two or more travels as one BUNDLE."""
    runs: list[list[Message]] = []
    size = 0
    for message in messages:
        nbytes = payload_nbytes(message)
        if not runs or len(runs[-1]) >= max_parts or size + nbytes > max_bytes:
            runs.append([])
            size = 0
        runs[-1].append(message)
        size += nbytes
    return runs


def _check_part(part: Message, index: int, reply: bool) -> None:
    if part.kind is Kind.BUNDLE:
        raise WireError(f"bundle part {index}: a bundle inside a bundle")
    if part.is_reply != reply:
        raise WireError(f"bundle part {index}: a {'reply' if reply else 'request'} bundle holds "
                        f"{'replies' if reply else 'requests'} only")
    if part.kind is not Kind.PUSHPULL and not (reply and part.kind is Kind.ERROR):
        raise WireError(f"bundle part {index}: a bundle carries PUSHPULLs and their answers, not {part.kind.name}")


def _encode_bundle(message: Message) -> list[bytes | memoryview]:
    parts = message.parts or []
    if not 1 <= len(parts) <= MAX_BUNDLE_PARTS:
        raise WireError(f"a bundle holds 1..{MAX_BUNDLE_PARTS} parts, not {len(parts)}")
    frames: list[bytes | memoryview] = []
    counts = []
    for index, part in enumerate(parts):
        _check_part(part, index, message.is_reply)
        encoded = encode(part)
        fields = _HEADER.unpack_from(encoded[0], 0)
        dims = struct.unpack_from(f"<{fields[6]}Q", encoded[0], _HEADER.size)
        counts.append(len(encoded))
        frames += [compact(fields[2:], dims), *encoded[1:]]  # magic and version are the bundle's
    header = _HEADER.pack(_MAGIC, PROTOCOL_VERSION, int(Kind.BUNDLE), int(message.flags) & _REPLY, 0, 0, 0,
                          message.priority, 0, 0, 1, message.request_id, 0)
    return [header, json.dumps({BUNDLE_PARTS: counts}, separators=(",", ":")).encode(), *frames]


def _decode_parts(body: dict[str, Any] | None, frames: Sequence[Any], reply: bool,
                  max_message_bytes: int) -> list[Message]:
    """A bundle's parts, each decoded and checked as a message of its own."""
    unknown = sorted(set(body or {}) - {BUNDLE_PARTS})
    if unknown:
        raise WireError(f"bundle body has unknown keys {unknown}; it holds only {BUNDLE_PARTS!r}")
    counts = (body or {}).get(BUNDLE_PARTS)
    if not isinstance(counts, list) or not 1 <= len(counts) <= MAX_BUNDLE_PARTS:
        raise WireError(f"bundle body needs {BUNDLE_PARTS!r}: a list of 1..{MAX_BUNDLE_PARTS} frame counts")
    if not all(type(count) is int and 2 <= count <= 2 + MAX_ENCODED_FRAMES for count in counts):
        raise WireError(f"bundle part frame counts must be integers in 2..{2 + MAX_ENCODED_FRAMES}")
    if sum(counts) != len(frames):
        raise WireError(f"bundle of {len(counts)} parts declares {sum(counts)} frames but carries {len(frames)} "
                        "(truncated, or its part count is wrong)")
    if frames_nbytes(frames) > max_message_bytes:
        raise WireError(f"bundle of {frames_nbytes(frames)} bytes exceeds the limit {max_message_bytes}")
    parts = []
    start = 0
    for index, count in enumerate(counts):
        try:
            fields, dims = expand(bytes(_buffer(frames[start])))
            header = _HEADER.pack(_MAGIC, PROTOCOL_VERSION, *fields) + struct.pack(f"<{len(dims)}Q", *dims)
            part = decode([header, *frames[start + 1:start + count]], max_message_bytes, _inside=True)
        except (WireError, CompactError, struct.error) as exc:
            raise WireError(f"bundle part {index}: {exc}") from None
        _check_part(part, index, reply)
        parts.append(part)
        start += count
    return parts

