"""BF16: float32 on the worker, bfloat16's bits on the wire: half the bytes, float32's range, 8 bits of mantissa.

bfloat16 is float32 without the low 16 bits of its mantissa: encoding rounds each float32 to nearest even at
bit 16 (as torch rounds a float32 into bfloat16), decoding appends 16 zero bits. A bfloat16 model's values, widened
to float32 to travel (``geomx.protocol.tensors``), so cross the wire exactly: its pushes lose nothing, and a server's
float32 answer (a sum, new weights) is rounded as the model rounds it when it lands. Unlike float16 there is no range
to leave below float32's: only a value within half a bfloat16 step of float32's largest rounds to inf, and it
saturates to bfloat16's largest finite value instead. NaN or inf inputs are refused with CodecError.

Usage (``compression: {type: bf16}`` in the topology's ``training`` block)::

    payload = BF16().encode(grad, info)           # one uint16 frame, meta {"n": grad.size}
    grad_hat = BF16().decode(payload, grad.shape, np.dtype(np.float32))
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from .base import Codec, Encoded, TensorInfo, check_finite, dense_frame, float_vector, to_dtype

_HALF_STEP = np.uint32(0x7FFF)  # half of bfloat16's step less one, in float32's low bits: a tie adds the kept last bit
_INF = np.uint16(0x7F80)  # bfloat16's inf (its magnitude bits)
_LARGEST = np.uint16(0x7F7F)  # bfloat16's largest finite magnitude
_SIGN = np.uint16(0x8000)


def to_bfloat16_bits(x: np.ndarray) -> np.ndarray:
    """``x`` (float32, finite) as bfloat16's bits, rounded to nearest even, saturating at bfloat16's largest."""
    bits = np.ascontiguousarray(x, dtype=np.float32).reshape(-1).view(np.uint32)  # a view of x: only read
    rounded = (bits >> 16) & 1
    rounded += _HALF_STEP
    rounded += bits  # finite values stay below 2**32 (the largest negative, 0xFF7FFFFF, plus 0x8000)
    rounded >>= 16
    out = rounded.astype(np.uint16)
    over = (out & ~_SIGN) == _INF
    if over.any():
        out[over] = (out[over] & _SIGN) | _LARGEST
    return out


def from_bfloat16_bits(bits: np.ndarray) -> np.ndarray:
    """bfloat16's bits as float32 values (exact), in a new array."""
    wide = bits.astype(np.uint32)
    wide <<= 16
    return wide.view(np.float32)


class BF16(Codec):
    """Dense bfloat16 transport, rounded to nearest even."""

    name: ClassVar[str] = "bf16"
    codec_id: ClassVar[int] = 4

    def encode(self, array: np.ndarray, info: TensorInfo) -> Encoded:
        what = f"key {info.key} slice {info.slice}"
        x = float_vector(array, what)
        check_finite(x, what)
        return Encoded(self.codec_id, [to_bfloat16_bits(x)], {"n": x.size})

    def decode(self, encoded: Encoded, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
        bits, dtype = dense_frame(encoded, self, shape, dtype, np.uint16, "bf16 values")
        values = from_bfloat16_bits(bits)
        check_finite(values, "bf16 values")
        return to_dtype(values, dtype, owned=True).reshape(shape)

    def estimate_ratio(self, numel: int, dtype: Any) -> float:
        return 2.0 / int(np.dtype(dtype).itemsize)
