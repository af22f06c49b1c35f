"""Between codec payloads and wire messages: what a server attaches to a message and decodes from one.

Usage::

    fields = payload_fields(codec, array, TensorInfo(key, index, "gradient", "push"))
    message = Message(Kind.PUSHPULL, key=key, slice=index, **fields)
    dense = decode_message(registry, received)      # the dense array, whatever codec encoded it
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..protocol.wire import CODEC_META, Message
from .base import DENSE_ID, Codec, CodecError, Encoded, TensorInfo
from .registry import Registry


def payload_fields(codec: Codec, array: np.ndarray, info: TensorInfo) -> dict[str, Any]:
    """Message fields carrying ``array`` encoded by ``codec`` (plain ``tensor`` when it chose dense)."""
    encoded = codec.encode(array, info)
    if encoded.codec_id == DENSE_ID:
        return {"tensor": array}
    return {"codec": encoded.codec_id, "encoded": encoded.frames, "dtype": array.dtype, "shape": array.shape,
            "body": {CODEC_META: encoded.meta}}


def decode_message(registry: Registry, message: Message) -> np.ndarray | None:
    """The dense tensor of ``message`` (decoding its codec payload if it has one); CodecError if malformed."""
    if message.encoded is None:
        return message.tensor
    if message.dtype is None:
        raise CodecError("an encoded payload without a dtype")
    meta = (message.body or {}).get(CODEC_META, {})
    if not isinstance(meta, dict):
        raise CodecError(f"{CODEC_META} must be an object")
    encoded = Encoded(message.codec, list(message.encoded), meta)
    return registry.decode(encoded, tuple(message.shape), np.dtype(message.dtype))
