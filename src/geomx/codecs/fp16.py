"""FP16: float32 on the worker, float16 on the wire — exactly half the bytes, ~3 significant digits.

GeoMX gets this by casting tensors to float16 in the training script, so its servers *sum* in float16.
Here only the wire is float16: the receiver decodes to float32 before any arithmetic.

Range rule: values beyond ±65504 (the largest finite float16) saturate to ±65504 instead of becoming
inf, because one inf poisons the server's sum for every party. NaN or inf *inputs* are refused with
CodecError (a diverged model should fail loudly, not travel). Wrap in ErrorFeedback to carry the
rounding and clipping error into the next round.

Usage::

    payload = FP16().encode(grad, info)           # one float16 frame, meta {"n": grad.size}
    grad_hat = FP16().decode(payload, grad.shape, np.dtype(np.float32))
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from .base import Codec, Encoded, TensorInfo, check_finite, dense_frame, float_vector, saturating_cast, to_dtype


class FP16(Codec):
    """Dense float16 transport with saturation at ±65504."""

    name: ClassVar[str] = "fp16"
    codec_id: ClassVar[int] = 1

    def encode(self, array: np.ndarray, info: TensorInfo) -> Encoded:
        array = np.asarray(array)
        what = f"key {info.key} slice {info.slice}"
        if array.dtype == np.float16:  # already on the wire's precision: no float32 round trip
            check_finite(array, what)
            return Encoded(self.codec_id, [np.ascontiguousarray(array).reshape(-1)], {"n": array.size})
        x = float_vector(array, what)
        check_finite(x, what)
        return Encoded(self.codec_id, [saturating_cast(x, np.float16)], {"n": x.size})

    def decode(self, encoded: Encoded, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
        half, dtype = dense_frame(encoded, self, shape, dtype, np.float16, "fp16 values")
        check_finite(half, "fp16 values")
        return to_dtype(half, dtype, owned=False).reshape(shape)

    def estimate_ratio(self, numel: int, dtype: Any) -> float:
        return 2.0 / int(np.dtype(dtype).itemsize)
