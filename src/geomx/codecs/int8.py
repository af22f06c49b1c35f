"""INT8: 8-bit integers with one float32 scale per block — about 3.9x fewer bytes than float32.

Each block of ``block`` consecutive elements is scaled by ``max|x| / 127`` and rounded to the nearest
integer in [-127, 127] (ties to even), so the error per element is at most half a step of its block:
``max|x_block| / 254``. Small per-block scales keep one large outlier from flattening a whole tensor.
It is biased per round, so use it wrapped in ErrorFeedback (``{"type": "error_feedback", "inner":
{"type": "int8"}}``), which carries the rounding error into the next round.

Wire layout: frames ``[q: int8 × n, scales: float32 × ceil(n / block)]``, meta ``{"n", "block"}``.

Usage::

    codec = ErrorFeedback(Int8(block=256))
    payload = codec.encode(grad, info)
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from .base import (
    Codec,
    CodecError,
    Encoded,
    TensorInfo,
    check_finite,
    check_frame_count,
    check_id,
    check_meta_n,
    float_vector,
    frame_as,
    meta_int,
    output_size,
    to_dtype,
)

MAX_BLOCK = 1 << 24


def _max_scale() -> float:
    """The largest float32 scale whose 127 multiple is still finite in float32: a decoded value ``q * scale`` never
    overflows, so decoding needs no pass over its output to check it."""
    scale = np.float32(float(np.finfo(np.float32).max) / 127)
    with np.errstate(over="ignore"):
        while not np.isfinite(np.float32(127) * scale):
            scale = np.nextafter(scale, np.float32(0))
    return float(scale)


MAX_SCALE = _max_scale()


def _blocks(x: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """Views of ``x``: its full blocks as rows, and the partial last block (possibly empty)."""
    full = x.size // block * block
    return x[:full].reshape(-1, block), x[full:]


class Int8(Codec):
    """Per-block absmax int8 quantisation (rounding to nearest)."""

    name: ClassVar[str] = "int8"
    codec_id: ClassVar[int] = 3

    def __init__(self, block: int = 256) -> None:
        if not 1 <= block <= MAX_BLOCK:
            raise CodecError(f"int8 block={block} must be in [1, {MAX_BLOCK}]")
        self.block = block

    def encode(self, array: np.ndarray, info: TensorInfo) -> Encoded:
        """One float32 buffer besides the int8 output: each block's absolute values go into it (their maxima are
        the scales, and check the values for NaN and inf: a maximum propagates NaN), then the quotients."""
        x = float_vector(array, f"key {info.key} slice {info.slice}")  # may view the caller's array: read only
        rows, tail = _blocks(x, self.block)
        y = np.empty_like(x)
        y_rows, y_tail = _blocks(y, self.block)
        absmax = np.empty(len(rows) + (1 if tail.size else 0), np.float32)
        if rows.size:
            np.abs(rows, out=y_rows).max(axis=1, out=absmax[:len(rows)])
        if tail.size:
            absmax[len(rows)] = np.abs(tail, out=y_tail).max()
        check_finite(absmax, f"key {info.key} slice {info.slice}")
        scales = absmax / np.float32(127)
        np.minimum(scales, np.float32(MAX_SCALE), out=scales)  # 127 * scale stays finite (values clip to 127)
        # Divide (not multiply by 1/scale): 1/scale overflows to inf for subnormal scales. All-zero
        # blocks divide by 1 instead of 0.
        divisors = np.where(scales > 0, scales, np.float32(1))
        np.divide(rows, divisors[: len(rows), None], out=y_rows)
        np.divide(tail, divisors[len(rows):], out=y_tail)
        np.rint(y, out=y)
        np.clip(y, -127, 127, out=y)  # by rounding (or a clamped or subnormal scale) |y| may pass 127
        return Encoded(self.codec_id, [y.astype(np.int8), scales], {"n": x.size, "block": self.block})

    def decode(self, encoded: Encoded, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
        """Two passes (to float32, times each block's scale); the output is finite by the scales' bound, so it is
        never checked again."""
        check_id(encoded, self)
        numel, dtype = output_size(shape, dtype)
        check_frame_count(encoded, 2, self.name)
        check_meta_n(encoded, numel)
        block = meta_int(encoded, "block", 1, MAX_BLOCK)
        q = frame_as(encoded.frames[0], np.int8, numel, "int8 values")
        scales = frame_as(encoded.frames[1], np.float32, -(-numel // block), "int8 scales")
        check_finite(scales, "int8 scales")
        if scales.size and not 0 <= float(scales.min()) <= float(scales.max()) <= MAX_SCALE:
            raise CodecError(f"int8 scales must lie in [0, {MAX_SCALE:.4g}] (127 * scale must stay finite)")
        if numel and int(q.min()) < -127:
            raise CodecError("int8 values must be in [-127, 127]; -128 is never produced")
        out = q.astype(np.float32)  # no padding: a huge block in the meta must not make us allocate
        rows, tail = _blocks(out, block)
        rows *= scales[: len(rows), None]
        tail *= scales[len(rows):]
        return to_dtype(out, dtype, owned=True).reshape(shape)

    def estimate_ratio(self, numel: int, dtype: Any) -> float:
        if numel == 0:
            return 1.0
        return (numel + 4 * -(-numel // self.block)) / (numel * int(np.dtype(dtype).itemsize))

    def __repr__(self) -> str:
        return f"Int8(block={self.block})"
