"""The float16 casts of ``geomx.codecs.half`` against NumPy's own ``astype``, bit for bit: every float16 value
back to float32, every rounding boundary between two float16 values (the midpoints, where rounding to even
decides, and the float32 values either side), and arbitrary float32 values by hypothesis."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from geomx.codecs import FP16
from geomx.codecs.base import TensorInfo
from geomx.codecs.half import from_half, to_half


def _same_bits(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype
    bits = np.uint16 if got.dtype == np.float16 else np.uint32
    mismatch = np.flatnonzero(got.view(bits) != want.view(bits))
    assert mismatch.size == 0, f"{mismatch.size} values differ, first at {mismatch[:5]}"


def _finite_halves() -> np.ndarray:
    """Every finite float16, in order, -65504 to 65504 (both zeros)."""
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    return np.sort(every[np.isfinite(every)])


def test_every_float16_comes_back_as_numpy_casts_it() -> None:
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    finite = every[np.isfinite(every)]
    _same_bits(from_half(finite), finite.astype(np.float32))
    assert np.isnan(from_half(every[np.isnan(every)])).all()
    assert list(from_half(np.array([np.inf, -np.inf], dtype=np.float16))) == [np.inf, -np.inf]


def test_every_rounding_boundary_rounds_as_numpy_rounds_it() -> None:
    """Each float16, each midpoint between neighbours (exact in float32) and the float32 values just either
    side of it: the subnormal range, the normal range, and the largest finite value."""
    halves = _finite_halves().astype(np.float32)
    mids = (halves[:-1].astype(np.float64) + halves[1:]) / 2
    mids = mids.astype(np.float32)
    assert np.array_equal(mids.astype(np.float64), (halves[:-1].astype(np.float64) + halves[1:]) / 2)
    values = np.concatenate([halves, mids, np.nextafter(mids, np.float32(np.inf)),
                             np.nextafter(mids, np.float32(-np.inf)), np.float32([0.0, -0.0, 2.0 ** -25, 1e-30])])
    _same_bits(to_half(values), values.astype(np.float16))


@settings(max_examples=200, deadline=None)
@given(hnp.arrays(np.float32, st.integers(0, 300), elements=st.floats(-65504, 65504, width=32)))
def test_arbitrary_float32_values_cast_as_numpy_casts_them(values: np.ndarray) -> None:
    _same_bits(to_half(values), values.astype(np.float16))
    half = values.astype(np.float16)
    _same_bits(from_half(half), half.astype(np.float32))


def test_the_input_is_not_written_and_the_shape_is_kept() -> None:
    values = np.float32([[1e-5, -3.0], [65504.0, 0.1]])
    before = values.copy()
    half = to_half(values)
    assert half.shape == (2, 2) and np.array_equal(values, before)


def test_the_fp16_codec_on_small_values_is_numpys_cast() -> None:
    """What the WAN carries under fp16 (a DiLoCo delta, mostly subnormal in float16) is what NumPy's cast gives."""
    delta = (np.random.default_rng(0).standard_normal(50_000) * 1e-5).astype(np.float32)
    codec = FP16()
    encoded = codec.encode(delta, TensorInfo(0, 0, "delta", "push", delta.size))
    _same_bits(np.asarray(encoded.frames[0]).view(np.float16), delta.astype(np.float16))
    _same_bits(codec.decode(encoded, delta.shape, np.dtype(np.float32)), delta.astype(np.float16).astype(np.float32))
