"""DENSE (codec id 0): the tensor's own bytes, unchanged — what wire.py sends when no codec is chosen.

It exists as a codec so composites can say "send this one as it is" (e.g. Bi-Sparse's tiny tensors)
through the same interface, and so a receiver decodes id 0 like any other id.

Usage::

    payload = Dense().encode(bias, info)          # frames == [bias.reshape(-1)] (no copy), meta {"dtype": ...}
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from .base import (
    DENSE_ID,
    FLOAT_DTYPES,
    Codec,
    CodecError,
    Encoded,
    TensorInfo,
    check_finite,
    check_float_dtype,
    check_frame_count,
    check_id,
    frame_as,
    output_size,
    to_dtype,
)

_FLOAT_NAMES = {dtype.name: dtype for dtype in FLOAT_DTYPES}


class Dense(Codec):
    """No compression: one frame holding the array in its own dtype.

    meta ``{"dtype": name}`` says which float dtype the frame holds; without it (a plain wire.py DENSE
    message) the frame is in the requested dtype, i.e. the header's.
    """

    name: ClassVar[str] = "dense"
    codec_id: ClassVar[int] = DENSE_ID

    def encode(self, array: np.ndarray, info: TensorInfo) -> Encoded:
        array = check_float_dtype(array, f"key {info.key} slice {info.slice}")
        check_finite(array, f"key {info.key} slice {info.slice}")
        return Encoded(self.codec_id, [np.ascontiguousarray(array).reshape(-1)], {"dtype": array.dtype.name})

    def decode(self, encoded: Encoded, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
        check_id(encoded, self)
        numel, dtype = output_size(shape, dtype)
        check_frame_count(encoded, 1, self.name)
        meta = encoded.meta if isinstance(encoded.meta, dict) else {"?": encoded.meta}
        if set(meta) - {"dtype"}:
            raise CodecError(f"dense payload meta has only 'dtype', got {sorted(map(str, meta))}")
        sent = meta.get("dtype", dtype.name)
        if not isinstance(sent, str) or sent not in _FLOAT_NAMES:
            raise CodecError(f"dense payload dtype {sent!r} is not one of {sorted(_FLOAT_NAMES)}")
        values = frame_as(encoded.frames[0], _FLOAT_NAMES[sent], numel, "dense values")
        check_finite(values, "dense values")
        return to_dtype(values, dtype, owned=False).reshape(shape)

    def estimate_ratio(self, numel: int, dtype: Any) -> float:
        return 1.0
