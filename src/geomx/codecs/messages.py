"""Between codec payloads and wire messages: what a server attaches to a message and decodes from one.

A codec's meta travels in one of two ways: as JSON in the message's body under ``CODEC_META`` (any codec), or, for a
codec that declares ``meta_fields`` and whose meta is those non-negative integers below 2**32, as one more frame of
little-endian uint32s after the codec's own frames, with no body at all. Why the second: a small model sends one
message per tensor each round, and at 87.7K parameters in 30 tensors the JSON meta cost sparse2bit 0.017 bytes per
parameter, half as much as its payload (0.037); the frame costs 16 bytes a message. The receiver tells the two
apart by the body: no ``CODEC_META`` there means the last frame is the meta.

Usage::

    fields = payload_fields(codec, array, TensorInfo(key, index, "gradient", "push"))
    message = Message(Kind.PUSHPULL, key=key, slice=index, **fields)
    dense = decode_message(registry, received)      # the dense array, whatever codec encoded it
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..protocol.wire import CODEC_META, Message
from .base import DENSE_ID, Codec, CodecError, Encoded, MetaValue, TensorInfo
from .registry import BUILTINS, Registry

META_DTYPE = np.dtype("<u4")
PACKED_META = {cls.codec_id: cls.meta_fields for cls in BUILTINS if cls.meta_fields}


def meta_frame(fields: tuple[str, ...], meta: dict[str, MetaValue]) -> np.ndarray | None:
    """``meta`` as uint32s in ``fields``' order, or None where it is not exactly those fields as integers that fit
    (then it travels as JSON)."""
    if not fields or set(meta) != set(fields):
        return None
    values = [meta[name] for name in fields]
    if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**32 for v in values):
        return None
    return np.array(values, dtype=META_DTYPE)


def payload_fields(codec: Codec, array: np.ndarray, info: TensorInfo) -> dict[str, Any]:
    """Message fields carrying ``array`` encoded by ``codec`` (plain ``tensor`` when it chose dense)."""
    encoded = codec.encode(array, info)
    if encoded.codec_id == DENSE_ID:
        return {"tensor": array}
    fields: dict[str, Any] = {"codec": encoded.codec_id, "encoded": encoded.frames, "dtype": array.dtype,
                              "shape": array.shape}
    # the built-in class that made the payload (by the id it carries: a composite's part too) says how its meta
    # travels; a codec registered by a job's own code sends JSON (the receiver looks at the body first)
    packed = meta_frame(PACKED_META.get(encoded.codec_id, ()), encoded.meta)
    if packed is None:
        fields["body"] = {CODEC_META: encoded.meta}
    else:
        fields["encoded"] = [*encoded.frames, packed.view(np.uint8)]
    return fields


def decode_message(registry: Registry, message: Message) -> np.ndarray | None:
    """The dense tensor of ``message`` (decoding its codec payload if it has one); CodecError if malformed."""
    if message.encoded is None:
        return message.tensor
    if message.dtype is None:
        raise CodecError("an encoded payload without a dtype")
    frames = list(message.encoded)
    body = message.body or {}
    if CODEC_META in body:
        meta = body[CODEC_META]
        if not isinstance(meta, dict):
            raise CodecError(f"{CODEC_META} must be an object")
    else:
        meta = unpack_meta(registry.codec_class(message.codec).meta_fields, frames)
    encoded = Encoded(message.codec, frames, meta)
    return registry.decode(encoded, tuple(message.shape), np.dtype(message.dtype))


def unpack_meta(fields: tuple[str, ...], frames: list[np.ndarray]) -> dict[str, MetaValue]:
    """The meta a payload without ``CODEC_META`` carries in its last frame (popped from ``frames``): ``fields`` as
    uint32s; {} for a codec that declares none. CodecError where that frame is missing or of the wrong size."""
    if not fields:
        return {}
    if len(frames) < 2 or frames[-1].nbytes != len(fields) * META_DTYPE.itemsize:
        raise CodecError(f"codec meta: the last frame must hold {len(fields)} uint32 ({', '.join(fields)}), "
                         f"got {frames[-1].nbytes if frames else 0} bytes")
    values = np.frombuffer(frames.pop().tobytes(), dtype=META_DTYPE)
    return {name: int(value) for name, value in zip(fields, values, strict=True)}
