"""Error feedback: a wrapper that makes any lossy codec unbiased over time.

Before encoding, the slice's residual (what earlier rounds failed to send) is added to the input; after
encoding, the new residual is ``input - decode(encode(input))``. So the sum of everything decoded
equals the sum of everything pushed minus one bounded residual: quantisation error does not pile up.
This is BytePS's and hivemind's shape — error feedback is a decorator, not a feature of each codec.

It refuses codecs that keep their own residual (Bi-Sparse's accumulated velocity already is one:
wrapping it would count unsent mass twice), and tensors of kind "weights" (absolute values are not
additive, so a residual of last round's weights does not belong in this round's).

Usage::

    codec = ErrorFeedback(Int8(block=256))
    payload = codec.encode(grad, TensorInfo(key=0, slice=0, kind="gradient", direction="push"))
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from .base import (
    COMPOSITE_ID,
    Codec,
    CodecError,
    Encoded,
    ResidualCodec,
    TensorInfo,
    check_kind,
    float_vector,
)


class ErrorFeedback(ResidualCodec):
    """Wraps ``inner``; keeps one float32 residual per (key, slice, direction)."""

    name: ClassVar[str] = "error_feedback"
    codec_id: ClassVar[int] = COMPOSITE_ID

    def __init__(self, inner: Codec) -> None:
        if inner.keeps_residual():
            raise CodecError(f"{inner!r} already carries its own residual; wrapping it in error feedback "
                             f"would send unsent mass twice")
        super().__init__()
        self.inner = inner

    def encode(self, array: np.ndarray, info: TensorInfo) -> Encoded:
        check_kind(info, self.name)
        shape = np.shape(array)
        x = float_vector(array, f"key {info.key} slice {info.slice}")
        residual = self._residuals.get(info, x.size)
        if residual is not None:
            x = x + residual  # a new array: the caller's tensor is never modified
        encoded = self.inner.encode(x.reshape(shape), info)  # raises (state untouched) on NaN or inf
        decoded = self.inner.decode(encoded, shape, np.dtype(np.float32)).reshape(-1)
        # the residual: into ``x`` where it is ours (the sum above), a new array where it is the caller's
        self._residuals.put(info, np.subtract(x, decoded, out=x if residual is not None else None))
        return encoded

    def decode(self, encoded: Encoded, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
        return self.inner.decode(encoded, shape, dtype)

    def estimate_ratio(self, numel: int, dtype: Any) -> float:
        return self.inner.estimate_ratio(numel, dtype)

    def wire_ids(self) -> frozenset[int]:
        return self.inner.wire_ids()

    def reset(self) -> None:
        super().reset()
        self.inner.reset()

    def __repr__(self) -> str:
        return f"ErrorFeedback({self.inner!r})"
