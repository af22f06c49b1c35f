"""WAN codecs: round trips, byte counts, Bi-Sparse selection and state (replayed against a plain NumPy DGC),
error-feedback sum tracking, strict rejection of malformed payloads, and the registry."""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from geomx.codecs import (
    BF16,
    BSC,
    COMPOSITE_ID,
    FP16,
    MPQ,
    Codec,
    CodecError,
    Dense,
    Encoded,
    ErrorFeedback,
    Int8,
    Registry,
    SizeAdaptive,
    Sparse2Bit,
    TensorInfo,
    default_registry,
    make_codec,
)
from geomx.codecs.base import MAX_DECODE_BYTES
from geomx.codecs.bsc import index_dtype, top_k_sampled
from geomx.codecs.int8 import MAX_SCALE
from geomx.protocol.wire import MAX_CODEC_ID

F32 = np.dtype(np.float32)
FP16_STEP = 2.0**-11  # relative half-spacing of float16 (10 mantissa bits)
FP16_TINY = 2.0**-25  # half the spacing of float16 subnormals


def info(key: int = 0, index: int = 0, kind: str = "gradient", direction: str = "push") -> TensorInfo:
    return TensorInfo(key=key, slice=index, kind=kind, direction=direction)  # type: ignore[arg-type]


def assert_fp16_close(decoded: np.ndarray, x: np.ndarray) -> None:
    x = x.astype(np.float64)
    assert np.all(np.abs(decoded.astype(np.float64) - x) <= np.abs(x) * FP16_STEP + FP16_TINY)


def assert_int8_close(decoded: np.ndarray, x: np.ndarray, block: int) -> None:
    """Error per element at most half a quantisation step of its block: max|x_block| / 254."""
    flat, out = x.reshape(-1).astype(np.float64), decoded.reshape(-1).astype(np.float64)
    for start in range(0, flat.size, block):
        chunk = flat[start:start + block]
        bound = np.abs(chunk).max() / 254 * (1 + 1e-5) + 1e-30
        assert np.all(np.abs(out[start:start + block] - chunk) <= bound)


# ---- round trips over shapes and dtypes ----------------------------------------------------------------

def check_dense(codec: Codec, x: np.ndarray, decoded: np.ndarray) -> None:
    np.testing.assert_array_equal(decoded, x.astype(np.float32))


def check_fp16(codec: Codec, x: np.ndarray, decoded: np.ndarray) -> None:
    assert_fp16_close(decoded, x)


def check_bf16(codec: Codec, x: np.ndarray, decoded: np.ndarray) -> None:
    """torch's own rounding of the float32 values into bfloat16 (to nearest even), widened back exactly."""
    import torch

    want = torch.from_numpy(x.astype(np.float32)).bfloat16().float().numpy()
    np.testing.assert_array_equal(decoded, want)


def check_int8(codec: Codec, x: np.ndarray, decoded: np.ndarray) -> None:
    assert_int8_close(decoded, x, block=7)


def check_bsc(codec: Codec, x: np.ndarray, decoded: np.ndarray) -> None:
    """First step: what was sent plus what is pending is exactly the input (no element lost or altered)."""
    assert isinstance(codec, BSC)
    pending = codec.pending(info())
    assert pending is not None
    np.testing.assert_array_equal(decoded.reshape(-1) + pending, x.astype(np.float32).reshape(-1))
    assert np.all((decoded.reshape(-1) == 0) | (pending == 0))  # each element either sent or kept


def check_sparse2bit(codec: Codec, x: np.ndarray, decoded: np.ndarray) -> None:
    """First step: what was sent plus the residual is exactly the input (in float32)."""
    assert isinstance(codec, Sparse2Bit)
    residual = codec.residual(info())
    assert residual is not None
    np.testing.assert_array_equal(decoded.reshape(-1) + residual, x.astype(np.float32).reshape(-1))


ROUND_TRIP_CASES = [
    ({"type": "dense"}, check_dense),
    ({"type": "fp16"}, check_fp16),
    ({"type": "bf16"}, check_bf16),
    ({"type": "int8", "block": 7}, check_int8),
    ({"type": "error_feedback", "inner": {"type": "int8", "block": 7}}, check_int8),
    ({"type": "bsc", "threshold": 0.1, "size_lower_bound": 0}, check_bsc),
    ({"type": "bsc", "threshold": 0.1, "size_lower_bound": 0, "exact": True}, check_bsc),
    ({"type": "mpq", "threshold": 0.1, "size_lower_bound": 10**9}, check_fp16),  # everything "tiny"
    ({"type": "sparse2bit", "density": 0.2, "chunk": 5}, check_sparse2bit),
]

shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=9)


@st.composite
def tensors(draw: st.DrawFn) -> np.ndarray:
    dtype = draw(st.sampled_from([np.float32, np.float16]))
    width = 16 if dtype == np.float16 else 32
    elements = st.floats(-6e4, 6e4, allow_nan=False, allow_infinity=False, width=width)
    return draw(hnp.arrays(dtype, draw(shapes), elements=elements))


@pytest.mark.parametrize(("spec", "check"), ROUND_TRIP_CASES,
                         ids=["dense", "fp16", "bf16", "int8", "ef-int8", "bsc", "bsc-exact", "mpq-tiny",
                              "sparse2bit"])
@settings(max_examples=40, deadline=None)
@given(x=tensors())
def test_round_trip(spec: dict[str, Any], check: Any, x: np.ndarray) -> None:
    codec = make_codec(spec)
    before = x.copy()
    encoded = codec.encode(x, info())
    assert all(isinstance(f, np.ndarray) and f.flags.c_contiguous for f in encoded.frames)
    frames = [bytes(f.reshape(-1).view(np.uint8)) for f in encoded.frames]  # what a receiver gets
    received = Encoded(encoded.codec_id, [np.frombuffer(f, np.uint8) for f in frames], dict(encoded.meta))
    decoded = codec.decode(received, x.shape, F32)
    assert decoded.shape == x.shape and decoded.dtype == F32
    assert decoded.flags.writeable and not any(np.shares_memory(decoded, f) for f in received.frames)
    np.testing.assert_array_equal(x, before)  # the input is never modified
    inner = codec.large if isinstance(codec, SizeAdaptive) and codec.pick(x.size) is codec.large else codec
    check(inner, x, decoded)
    as_input_dtype = codec.decode(received, x.shape, x.dtype)
    assert as_input_dtype.dtype == x.dtype and as_input_dtype.shape == x.shape


def test_receiver_decodes_by_id_without_knowing_the_configuration() -> None:
    x = np.random.default_rng(1).standard_normal(5000).astype(np.float32)
    registry = default_registry()
    for spec in ({"type": "fp16"}, {"type": "int8", "block": 33}, {"type": "bsc", "threshold": 0.02,
                                                                     "size_lower_bound": 0}):
        codec = registry.make_codec(spec)
        encoded = codec.encode(x, info())
        np.testing.assert_array_equal(registry.decode(encoded, x.shape, F32), codec.decode(encoded, x.shape, F32))
    payload = BSC(threshold=0.01).encode(x, info())
    np.testing.assert_array_equal(BSC(threshold=0.5, momentum=0.0).decode(payload, x.shape, F32),
                                  registry.decode(payload, x.shape, F32))


def test_non_contiguous_and_0d_inputs() -> None:
    x = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2]
    for spec in ({"type": "fp16"}, {"type": "int8"}, {"type": "dense"}):
        codec = make_codec(spec)
        np.testing.assert_allclose(codec.decode(codec.encode(x, info()), x.shape, F32), x, atol=22 / 254)
    scalar = np.array(3.5, np.float32)
    assert FP16().decode(FP16().encode(scalar, info()), (), F32) == np.float32(3.5)


# ---- FP16 ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [0, 1, 7, 1000, 200_001])
def test_fp16_exactly_halves_bytes(n: int) -> None:
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    encoded = FP16().encode(x, info())
    assert encoded.nbytes * 2 == x.nbytes
    assert FP16().estimate_ratio(n, np.float32) == 0.5


def test_bf16_halves_bytes_carries_bfloat16_values_exactly_and_saturates_at_its_largest() -> None:
    import torch

    model = torch.randn(4099).bfloat16()  # a bfloat16 model's values, widened to float32 to travel
    x = model.float().numpy()
    encoded = BF16().encode(x, info())
    assert encoded.frames[0].nbytes == x.nbytes // 2 and BF16().estimate_ratio(x.size, np.float32) == 0.5
    np.testing.assert_array_equal(BF16().decode(encoded, x.shape, F32), x)  # exact: nothing lost
    ties = np.array([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 2**-133, 3.4e38, -3.4e38], np.float32)
    decoded = BF16().decode(BF16().encode(ties, info()), ties.shape, F32)
    largest = float(torch.finfo(torch.bfloat16).max)
    np.testing.assert_array_equal(decoded, [1.0, 1 + 4 * 2**-8, -1.0, 2**-133, largest, -largest])


def test_fp16_saturates_out_of_range_and_error_feedback_carries_the_excess() -> None:
    x = np.array([1e5, -1e6, 65504, 65519, -70000, 1.0], np.float32)
    decoded = FP16().decode(FP16().encode(x, info()), x.shape, F32)
    np.testing.assert_array_equal(decoded, [65504, -65504, 65504, 65504, -65504, 1.0])
    assert np.all(np.isfinite(decoded))
    ef = ErrorFeedback(FP16())
    ef.encode(x, info())
    np.testing.assert_allclose(ef.residual(info()), x - decoded)


# ---- refusing bad inputs ------------------------------------------------------------------------------

@pytest.mark.parametrize("spec", [{"type": "dense"}, {"type": "fp16"}, {"type": "bf16"}, {"type": "int8"},
                                  {"type": "error_feedback", "inner": {"type": "int8"}},
                                  {"type": "bsc", "size_lower_bound": 0}, {"type": "mpq", "size_lower_bound": 4}])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_input_is_refused_and_leaves_state_untouched(spec: dict[str, Any], bad: float) -> None:
    codec = make_codec(spec)
    good = np.ones(8, np.float32)
    first = codec.decode(codec.encode(good, info()), good.shape, F32)
    x = good.copy()
    x[3] = bad
    with pytest.raises(CodecError, match="NaN or inf"):
        codec.encode(x, info())
    with pytest.raises(CodecError, match="NaN or inf"):
        codec.encode(x.astype(np.float16), info())
    fresh = make_codec(spec)
    fresh.decode(fresh.encode(good, info()), good.shape, F32)
    # The failed encode changed nothing: the next step matches a codec that never saw it.
    np.testing.assert_array_equal(codec.decode(codec.encode(good, info()), good.shape, F32),
                                  fresh.decode(fresh.encode(good, info()), good.shape, F32))
    assert first.shape == good.shape


def test_non_float_inputs_are_refused() -> None:
    for codec in (FP16(), Int8(), BSC(), Dense()):
        with pytest.raises(CodecError, match="dtype"):
            codec.encode(np.arange(10), info())


def test_residual_codecs_refuse_weights_but_fp16_takes_them() -> None:
    w = np.ones(10, np.float32)
    for codec in (BSC(), ErrorFeedback(Int8())):
        with pytest.raises(CodecError, match="weights"):
            codec.encode(w, info(kind="weights"))
    FP16().encode(w, info(kind="weights"))
    with pytest.raises(CodecError, match="twice"):
        ErrorFeedback(BSC())
    with pytest.raises(CodecError, match="twice"):
        make_codec({"type": "error_feedback", "inner": {"type": "mpq"}})


def test_a_slice_changing_size_is_an_error_until_reset() -> None:
    for codec in (BSC(), ErrorFeedback(Int8())):
        codec.encode(np.ones(10, np.float32), info())
        with pytest.raises(CodecError, match="reset"):
            codec.encode(np.ones(11, np.float32), info())
        codec.encode(np.ones(11, np.float32), info(key=1))  # another key is another slice
        codec.reset()
        codec.encode(np.ones(11, np.float32), info())


# ---- INT8 ---------------------------------------------------------------------------------------------

def test_int8_error_bound_ratio_and_edge_blocks() -> None:
    rng = np.random.default_rng(2)
    x = (rng.standard_normal(10_000) * np.repeat(10.0 ** rng.integers(-6, 6, 40), 250)).astype(np.float32)
    x[:256] = 0  # an all-zero block
    x[256:512] = 1e-40  # a subnormal block: 1 / scale would overflow
    codec = Int8(block=256)
    encoded = codec.encode(x, info())
    q = encoded.frames[0]
    assert q.dtype == np.int8 and q.min() >= -127
    decoded = codec.decode(encoded, x.shape, F32)
    assert np.all(np.isfinite(decoded))
    assert_int8_close(decoded, x, block=256)
    assert encoded.nbytes == 10_000 + 4 * 40
    assert codec.estimate_ratio(10_000, np.float32) == pytest.approx((10_000 + 4 * 40) / 40_000)


@pytest.mark.parametrize("where", [0, 5, 9])  # in the first full block, the second, the partial last one
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_int8_finds_a_non_finite_value_in_any_block(where: int, bad: float) -> None:
    x = np.linspace(-1, 1, 10, dtype=np.float32)
    x[where] = bad
    with pytest.raises(CodecError, match="NaN or inf"):
        Int8(block=4).encode(x, info())


def test_int8_of_the_largest_float32_values_decodes_finite_and_a_larger_scale_is_refused() -> None:
    big = float(np.finfo(np.float32).max)
    x = np.array([big, -big, 1.0, big / 3, 0.5, -big], np.float32)
    codec = Int8(block=4)
    encoded = codec.encode(x, info())
    assert float(encoded.frames[1].max()) == MAX_SCALE  # clamped: 127 * scale is float32's largest, not inf
    decoded = codec.decode(encoded, x.shape, F32)
    assert np.all(np.isfinite(decoded)) and decoded[0] == np.float32(127) * np.float32(MAX_SCALE)
    np.testing.assert_allclose(decoded[[0, 1, 3, 5]], x[[0, 1, 3, 5]], rtol=0, atol=big / 254 * 1.001)  # half a step
    beyond = np.nextafter(np.float32(MAX_SCALE), np.float32(np.inf))
    forged = Encoded(Int8.codec_id, [np.full(4, 127, np.int8), np.array([beyond], np.float32)], {"n": 4, "block": 4})
    with pytest.raises(CodecError, match="scales must lie"):
        codec.decode(forged, (4,), F32)


# ---- Bi-Sparse: selection -----------------------------------------------------------------------------

DISTRIBUTIONS = {
    "normal": lambda rng, n: rng.standard_normal(n),
    "heavy_tailed": lambda rng, n: rng.standard_cauchy(n),
    "lognormal": lambda rng, n: rng.lognormal(0, 3, n) * rng.choice([-1, 1], n),
    "uniform": lambda rng, n: rng.uniform(-1, 1, n),
    "mostly_equal": lambda rng, n: np.where(rng.random(n) < 0.98, 0.5, rng.standard_normal(n)),
}


@pytest.mark.parametrize("distribution", sorted(DISTRIBUTIONS))
@pytest.mark.parametrize("threshold", [0.01, 0.001])
def test_sampled_selection_keeps_close_to_k(distribution: str, threshold: float) -> None:
    """The sampled threshold aims 3 sd below the k-th magnitude, then trims to k: the count is k, or in
    the rare under-shoot at worst ~0.9 k (the sample holds >= 128 expected picks, sd <= 9%; falling
    below 0.9 k needs the estimate off by > 4 sd). When k are found, they are exactly the top k."""
    rng = np.random.default_rng(3)
    n = 300_000
    k = max(1, int(n * threshold))
    exact_hits = 0
    for _ in range(10):
        magnitude = np.abs(DISTRIBUTIONS[distribution](rng, n)).astype(np.float32)
        chosen = top_k_sampled(magnitude, k, rng)
        assert 0.9 * k <= chosen.size <= k
        assert np.unique(chosen).size == chosen.size
        if chosen.size == k:
            exact_hits += 1
            kth = np.partition(magnitude, n - k)[n - k]
            assert magnitude[chosen].min() >= kth  # the top k (ties at the k-th value may differ)
    assert exact_hits >= 9


def test_bsc_keeps_the_threshold_fraction_step_after_step() -> None:
    rng = np.random.default_rng(4)
    n = 250_000
    codec = BSC(threshold=0.01)
    counts = []
    for _ in range(15):
        encoded = codec.encode(rng.standard_normal(n).astype(np.float32), info())
        assert encoded.frames[0].dtype == np.int32 and encoded.frames[1].dtype == np.float32
        counts.append(encoded.meta["k"])
    assert all(0.9 * 2500 <= c <= 2500 for c in counts)
    assert sum(counts) >= 0.99 * 15 * 2500
    assert codec.estimate_ratio(n, np.float32) == pytest.approx(2500 * 8 / (n * 4))


def test_bsc_never_sends_zeros() -> None:
    x = np.zeros(100_000, np.float32)
    x[[5, 500, 99_999]] = [1.0, -2.0, 3.0]
    for exact in (False, True):
        encoded = BSC(threshold=0.01, exact=exact, momentum=0.0).encode(x, info())
        np.testing.assert_array_equal(encoded.frames[0], [5, 500, 99_999])
        np.testing.assert_array_equal(encoded.frames[1], [1.0, -2.0, 3.0])


def test_bsc_decode_places_values_exactly() -> None:
    rng = np.random.default_rng(5)
    n = 50_000
    indices = np.sort(rng.choice(n, 700, replace=False)).astype(np.int32)
    values = rng.standard_normal(700).astype(np.float32)
    decoded = BSC().decode(Encoded(BSC.codec_id, [indices, values], {"n": n, "k": 700}), (100, 500), F32)
    flat = decoded.reshape(-1)
    np.testing.assert_array_equal(flat[indices], values)
    mask = np.ones(n, bool)
    mask[indices] = False
    assert not flat[mask].any()


def test_indices_are_integers_and_exact_beyond_2_pow_24() -> None:
    """Float32 indices (GeoMX's wire format) would map 2**24 + 1 to 2**24; ours are int32."""
    assert index_dtype(2**31 - 1) == np.int32 and index_dtype(2**31) == np.int64
    n = 2**24 + 64
    assert float(np.float32(2**24 + 1)) == 2**24  # the bug we do not copy
    far = np.array([3, 2**24 - 1, 2**24 + 1, 2**24 + 3, 2**24 + 63], np.int64)
    g = np.zeros(n, np.float32)
    g[far] = np.arange(1, 6, dtype=np.float32)
    encoded = BSC(threshold=0.001).encode(g, info(direction="pull"))
    indices, values = encoded.frames
    assert indices.dtype == np.int32
    np.testing.assert_array_equal(indices, far)
    decoded = BSC().decode(encoded, (n,), F32)
    np.testing.assert_array_equal(np.flatnonzero(decoded), far)
    np.testing.assert_array_equal(decoded[far], values)


# ---- Bi-Sparse: replay of DGC in plain NumPy ----------------------------------------------------------

def dgc_reference(grads: list[np.ndarray], threshold: float, momentum: float, warmup: int) -> list[np.ndarray]:
    """Deep Gradient Compression, written independently: full sort, no in-place tricks."""
    n = grads[0].size
    u = np.zeros(n, np.float32)
    v = np.zeros(n, np.float32)
    sent = []
    for step, g in enumerate(grads):
        u = np.float32(momentum) * u + g
        v = v + u
        fraction = threshold ** (step / warmup) if step < warmup else threshold
        k = max(1, int(n * fraction))
        order = np.argsort(-np.abs(v), kind="stable")
        selected = order if 2 * k >= n else order[:k]
        selected = selected[v[selected] != 0]
        out = np.zeros(n, np.float32)
        out[selected] = v[selected]
        u[selected] = 0
        v[selected] = 0
        sent.append(out)
    return sent


@pytest.mark.parametrize(("direction", "momentum", "warmup", "exact", "n"), [
    ("push", 0.9, 0, True, 2_000),
    ("push", 0.9, 4, True, 2_000),
    ("push", 0.5, 3, True, 1_001),
    ("pull", 0.9, 2, True, 2_000),  # pull ignores momentum: a plain residual
    ("push", 0.9, 3, False, 100_000),  # sampled: finds exactly the top k in these steps
])
def test_bsc_replays_dgc(direction: str, momentum: float, warmup: int, exact: bool, n: int) -> None:
    rng = np.random.default_rng(6)
    grads = [rng.standard_normal(n).astype(np.float32) for _ in range(12)]
    reference = dgc_reference(grads, 0.03, momentum if direction == "push" else 0.0, warmup)
    codec = BSC(threshold=0.03, momentum=momentum, warmup_steps=warmup, exact=exact)
    for step, (g, expected) in enumerate(zip(grads, reference, strict=True)):
        decoded = codec.decode(codec.encode(g, info(direction=direction)), g.shape, F32)
        np.testing.assert_allclose(decoded, expected, rtol=1e-6, atol=1e-7, err_msg=f"step {step}")


def test_bsc_pushes_deltas_without_momentum() -> None:
    """HFA pushes model deltas (already shaped by the local optimizer's momentum): plain error feedback."""
    rng = np.random.default_rng(9)
    grads = [rng.standard_normal(2_000).astype(np.float32) for _ in range(6)]
    reference = dgc_reference(grads, 0.03, 0.0, 0)
    codec = BSC(threshold=0.03, momentum=0.9, exact=True)
    for step, (g, expected) in enumerate(zip(grads, reference, strict=True)):
        decoded = codec.decode(codec.encode(g, info(kind="delta")), g.shape, F32)
        np.testing.assert_allclose(decoded, expected, rtol=1e-6, atol=1e-7, err_msg=f"step {step}")


def test_fp16_switch_is_a_topology_field_and_an_environment_flag(tmp_path: Any) -> None:
    from geomx.config import ConfigError, node_config_from_env, topology_from_dict, topology_to_dict

    raw = {"parties": {"dc0": {"workers": 1}}, "central": "dc0"}
    assert topology_from_dict(raw).fp16 is False
    topology = topology_from_dict({**raw, "fp16": True})
    assert topology.fp16 is True and topology_from_dict(topology_to_dict(topology)).fp16 is True
    with pytest.raises(ConfigError, match="'fp16' must be true or false"):
        topology_from_dict({**raw, "fp16": "yes"})
    env = {"GEOMX_ROLE": "worker", "GEOMX_PARTY": "dc0", "GEOMX_NUM_WORKERS": "1",
           "GEOMX_GLOBAL_SCHEDULER": "127.0.0.1:9000", "GEOMX_SCHEDULER": "127.0.0.1:9001"}
    assert node_config_from_env(env).topology.fp16 is False
    assert node_config_from_env({**env, "GEOMX_FP16": "1"}).topology.fp16 is True
    with pytest.raises(ConfigError, match="GEOMX_FP16 must be 0 or 1"):
        node_config_from_env({**env, "GEOMX_FP16": "half"})


def test_warmup_ramps_exponentially_per_slice() -> None:
    codec = BSC(threshold=0.01, warmup_steps=4)
    assert [round(codec.fraction(i), 4) for i in range(6)] == [1.0, 0.3162, 0.1, 0.0316, 0.01, 0.01]
    x = np.random.default_rng(7).standard_normal(10_000).astype(np.float32)
    first = codec.encode(x, info())
    assert first.meta["k"] == 10_000 and first.frames[0].size == 0  # dense layout: values only
    assert codec.encode(x, info()).meta["k"] == 3162
    assert codec.encode(x, info(direction="pull")).meta["k"] == 10_000  # its own step counter
    assert codec.encode(x, info(key=9)).meta["k"] == 10_000


# ---- error feedback -----------------------------------------------------------------------------------

@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), scale=st.floats(1e-3, 1e3), n=st.integers(1, 600),
       inner=st.sampled_from(["int8", "fp16"]))
def test_error_feedback_sum_tracks_sum_of_inputs(seed: int, scale: float, n: int, inner: str) -> None:
    """sum(inputs) - sum(decoded) == residual after every step, and the residual stays bounded by one
    step's quantisation error (it never grows with the number of steps)."""
    rng = np.random.default_rng(seed)
    codec = ErrorFeedback(make_codec({"type": inner, "block": 32} if inner == "int8" else {"type": inner}))
    total_in = np.zeros(n)
    total_out = np.zeros(n)
    largest = 0.0
    for _ in range(40):
        g = (rng.standard_normal(n) * scale * rng.uniform(0.1, 2)).astype(np.float32)
        largest = max(largest, float(np.abs(g).max()))
        total_out += codec.decode(codec.encode(g, info()), g.shape, F32)
        total_in += g
        residual = codec.residual(info())
        assert residual is not None
        np.testing.assert_allclose(total_in - total_out, residual, rtol=0, atol=largest * 1e-5)
        # int8: |r| <= (max|g| + |r|) / 254; fp16: half an ulp relative, but never finer than half the
        # smallest subnormal step (2**-25) for values in fp16's subnormal range
        bound = largest / 253 if inner == "int8" else largest * 2.0**-10 + 2.0**-25
        assert np.abs(residual).max() <= bound * 1.001 + 1e-30


def test_bsc_residual_is_what_is_still_pending() -> None:
    """Bi-Sparse's accumulated value is its error feedback: (no momentum) sum in - sum out == pending."""
    rng = np.random.default_rng(8)
    codec = BSC(threshold=0.01, momentum=0.0)
    total = np.zeros(20_000)
    for _ in range(30):
        g = rng.standard_normal(20_000).astype(np.float32)
        total += g - codec.decode(codec.encode(g, info(direction="pull")), g.shape, F32)
    np.testing.assert_allclose(total, codec.pending(info(direction="pull")), atol=1e-3)


def test_bsc_pushes_plain_error_feedback_by_default_and_dgc_momentum_when_asked() -> None:
    """The default chosen in the README ("Which local optimizer"): no momentum correction, so a pushed
    gradient's residual is exactly sum in - sum out (what Adam, the seeds' local optimizer, expects). With
    ``momentum=0.9`` the residual accumulates DGC's velocity ``u = 0.9 u + g`` (masked where sent) instead."""
    assert BSC().momentum == 0.0
    for spec in ({"type": "bsc"}, {"type": "mpq"}):
        assert make_codec(spec).large.momentum == 0.0
    assert make_codec({"type": "mpq", "momentum": 0.9}).large.momentum == 0.9
    rng = np.random.default_rng(12)
    plain, dgc = BSC(threshold=0.01, exact=True), BSC(threshold=0.01, momentum=0.9, exact=True)
    plain_total, dgc_total, velocity = np.zeros(5_000), np.zeros(5_000), np.zeros(5_000)
    for _ in range(10):
        g = rng.standard_normal(5_000).astype(np.float32)
        plain_total += g - plain.decode(plain.encode(g, info()), g.shape, F32)
        sent = dgc.decode(dgc.encode(g, info()), g.shape, F32)
        velocity = 0.9 * velocity + g
        dgc_total += velocity - sent
        velocity[sent != 0] = 0  # momentum factor masking
    np.testing.assert_allclose(plain.pending(info()), plain_total, atol=1e-3)
    np.testing.assert_allclose(dgc.pending(info()), dgc_total, atol=1e-3)
    assert np.abs(dgc_total - plain_total).max() > 1.0  # the two settings really differ


# ---- composites ---------------------------------------------------------------------------------------

def test_mpq_sends_tiny_tensors_fp16_and_large_ones_sparse_fp32() -> None:
    codec = make_codec({"type": "mpq", "threshold": 0.01, "size_lower_bound": 1000})
    assert isinstance(codec, MPQ) and codec.bound == 1000
    assert isinstance(codec.large, BSC) and codec.large.threshold == 0.01
    rng = np.random.default_rng(9)
    tiny, large = rng.standard_normal(999).astype(np.float32), rng.standard_normal(1000).astype(np.float32)
    tiny_payload, large_payload = codec.encode(tiny, info(0)), codec.encode(large, info(1))
    assert tiny_payload.codec_id == FP16.codec_id and large_payload.codec_id == BSC.codec_id
    assert large_payload.frames[1].dtype == np.float32 and large_payload.meta["k"] == 10
    assert_fp16_close(codec.decode(tiny_payload, tiny.shape, F32), tiny)
    assert np.count_nonzero(codec.decode(large_payload, large.shape, F32)) == 10
    assert codec.estimate_ratio(999, np.float32) == 0.5
    assert codec.estimate_ratio(10**6, np.float32) == pytest.approx(0.02)
    with pytest.raises(CodecError, match="codec id 3"):
        codec.decode(Int8().encode(tiny, info()), tiny.shape, F32)


def test_bsc_spec_sends_small_tensors_dense() -> None:
    codec = make_codec({"type": "bsc", "threshold": 0.01})
    assert isinstance(codec, SizeAdaptive) and codec.bound == 200_000 and isinstance(codec.small, Dense)
    bias = np.ones(10, np.float32)
    payload = codec.encode(bias, info())
    assert payload.codec_id == 0 and payload.frames[0].nbytes == bias.nbytes
    np.testing.assert_array_equal(codec.decode(payload, bias.shape, F32), bias)
    assert isinstance(make_codec({"type": "bsc", "size_lower_bound": 0}), BSC)


def test_the_size_gate_is_the_whole_tensors_size_when_the_slice_says_it() -> None:
    """A slice below the bound of a tensor above it is compressed (GeoMX gates whole tensors); a slice of a
    small tensor, or one whose tensor size is unknown, goes by its own size."""
    codec = make_codec({"type": "bsc", "threshold": 0.01, "size_lower_bound": 1000})
    piece = np.arange(600, dtype=np.float32)  # one of two slices of a 1200-element tensor
    of_large = TensorInfo(key=0, slice=1, kind="gradient", direction="push", tensor_numel=1200)
    assert codec.encode(piece, of_large).codec_id == BSC.codec_id
    assert codec.encode(piece, TensorInfo(0, 1, "gradient", "push", tensor_numel=900)).codec_id == 0
    assert codec.encode(piece, info()).codec_id == 0  # size unknown: the slice's 600
    assert codec.choose(piece, of_large) is codec.large


def test_size_adaptive_from_nested_spec() -> None:
    codec = make_codec({"type": "size_adaptive", "small": None, "large": {"type": "int8", "block": 64},
                        "bound": 100})
    assert isinstance(codec, SizeAdaptive) and isinstance(codec.small, Dense) and isinstance(codec.large, Int8)
    assert codec.encode(np.ones(99, np.float32), info()).codec_id == 0
    assert codec.encode(np.ones(100, np.float32), info()).codec_id == Int8.codec_id
    assert codec.wire_ids() == {0, Int8.codec_id}


# ---- malformed payloads -------------------------------------------------------------------------------

N = 1000
IDX = np.array([1, 5, 9], np.int32)
VAL = np.array([1.0, 2.0, 3.0], np.float32)


def bsc_payload(frames: list[Any] | None = None, **meta: Any) -> Encoded:
    return Encoded(BSC.codec_id, [IDX, VAL] if frames is None else frames, {"n": N, "k": 3, **meta})


MALFORMED: list[tuple[str, Codec, Encoded, tuple[int, ...]]] = [
    ("bsc one frame", BSC(), bsc_payload([IDX]), (N,)),
    ("bsc three frames", BSC(), bsc_payload([IDX, VAL, VAL]), (N,)),
    ("bsc index out of range", BSC(), bsc_payload([np.array([1, 5, N], np.int32), VAL]), (N,)),
    ("bsc negative index", BSC(), bsc_payload([np.array([-1, 5, 9], np.int32), VAL]), (N,)),
    ("bsc duplicate index", BSC(), bsc_payload([np.array([1, 5, 5], np.int32), VAL]), (N,)),
    ("bsc unsorted index", BSC(), bsc_payload([np.array([5, 1, 9], np.int32), VAL]), (N,)),
    ("bsc extreme indices", BSC(), bsc_payload([np.array([0, -2**31, 9], np.int32), VAL]), (N,)),
    ("bsc values too long", BSC(), bsc_payload([IDX, np.zeros(4, np.float32)]), (N,)),
    ("bsc indices as float", BSC(), bsc_payload([IDX.astype(np.float64), VAL]), (N,)),
    ("bsc NaN value", BSC(), bsc_payload([IDX, np.array([1, np.nan, 3], np.float32)]), (N,)),
    ("bsc inf value", BSC(), bsc_payload([IDX, np.array([1, np.inf, 3], np.float32)]), (N,)),
    ("bsc absurd n", BSC(), bsc_payload(n=10**18), (N,)),
    ("bsc n mismatch", BSC(), bsc_payload(n=N + 1), (N,)),
    ("bsc negative n", BSC(), bsc_payload(n=-1), (N,)),
    ("bsc n as string", BSC(), bsc_payload(n="1000"), (N,)),
    ("bsc n as bool", BSC(), bsc_payload(n=True), (1,)),
    ("bsc n as float", BSC(), bsc_payload(n=1000.0), (N,)),
    ("bsc k above n", BSC(), bsc_payload(k=N + 1), (N,)),
    ("bsc no meta", BSC(), Encoded(BSC.codec_id, [IDX, VAL], {}), (N,)),
    ("bsc dense layout with indices", BSC(),
     Encoded(BSC.codec_id, [IDX, VAL], {"n": 3, "k": 3}), (3,)),
    ("bsc absurd shape", BSC(), bsc_payload(n=2**40), (2**40,)),
    ("bsc absurd shape, many dims", BSC(), bsc_payload(), (2**20, 2**20, 2**20)),
    ("bsc negative dim", BSC(), bsc_payload(), (-1,)),
    ("bsc frames not arrays", BSC(), bsc_payload(["abc", VAL]), (N,)),
    ("bsc object frame", BSC(), bsc_payload([np.array([None] * 3), VAL]), (N,)),
    ("bsc strided frame", BSC(), bsc_payload([np.arange(6, dtype=np.int32)[::2], VAL]), (N,)),
    ("bsc wrong codec id", BSC(), Encoded(FP16.codec_id, [IDX, VAL], {"n": N, "k": 3}), (N,)),
    ("fp16 short frame", FP16(), Encoded(FP16.codec_id, [np.zeros(9, np.float16)], {"n": 10}), (10,)),
    ("fp16 NaN", FP16(), Encoded(FP16.codec_id, [np.full(2, np.nan, np.float16)], {"n": 2}), (2,)),
    ("fp16 inf", FP16(), Encoded(FP16.codec_id, [np.full(2, np.inf, np.float16)], {"n": 2}), (2,)),
    ("fp16 no frames", FP16(), Encoded(FP16.codec_id, [], {"n": 0}), (0,)),
    ("int8 -128", Int8(), Encoded(Int8.codec_id, [np.array([-128], np.int8), np.ones(1, np.float32)],
                                  {"n": 1, "block": 256}), (1,)),
    ("int8 negative scale", Int8(), Encoded(Int8.codec_id, [np.ones(1, np.int8), -np.ones(1, np.float32)],
                                            {"n": 1, "block": 256}), (1,)),
    ("int8 NaN scale", Int8(), Encoded(Int8.codec_id, [np.ones(1, np.int8), np.full(1, np.nan, np.float32)],
                                       {"n": 1, "block": 256}), (1,)),
    ("int8 block 0", Int8(), Encoded(Int8.codec_id, [np.ones(1, np.int8), np.ones(1, np.float32)],
                                     {"n": 1, "block": 0}), (1,)),
    ("int8 scales count", Int8(), Encoded(Int8.codec_id, [np.ones(300, np.int8), np.ones(1, np.float32)],
                                          {"n": 300, "block": 256}), (300,)),
    ("dense wrong length", Dense(), Encoded(0, [np.zeros(3, np.float32)], {}), (4,)),
    ("dense NaN", Dense(), Encoded(0, [np.full(4, np.nan, np.float32)], {}), (4,)),
    ("dense meta", Dense(), Encoded(0, [np.zeros(4, np.float32)], {"n": 4}), (4,)),
    ("dense int dtype", Dense(), Encoded(0, [np.zeros(4, np.int32)], {"dtype": "int32"}), (4,)),
    ("dense dtype mismatch", Dense(), Encoded(0, [np.zeros(4, np.float32)], {"dtype": "float16"}), (4,)),
    ("mpq unknown id", MPQ(), Encoded(7, [np.zeros(4, np.float32)], {}), (4,)),
]


@pytest.mark.parametrize(("codec", "payload", "shape"), [case[1:] for case in MALFORMED],
                         ids=[case[0] for case in MALFORMED])
def test_malformed_payloads_raise_codec_error(codec: Codec, payload: Encoded, shape: tuple[int, ...]) -> None:
    with pytest.raises(CodecError):
        codec.decode(payload, shape, F32)


def test_decode_refuses_non_float_output_dtypes() -> None:
    payload = FP16().encode(np.ones(3, np.float32), info())
    with pytest.raises(CodecError, match="float"):
        FP16().decode(payload, (3,), np.dtype(np.int32))
    assert MAX_DECODE_BYTES >= 2**31


meta_values = st.one_of(st.integers(-2**62, 2**62), st.integers(0, 64), st.floats(), st.text(max_size=3),
                        st.sampled_from(["float16", "float32", "int8"]), st.booleans(), st.none(),
                        st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=2), st.integers(),
                                                                             max_size=1))


@settings(max_examples=300, deadline=None)
@given(codec_id=st.one_of(st.sampled_from([0, 1, 2, 3, 4, 5]), st.integers(-5, 300)),
       frames=st.lists(st.binary(max_size=48), max_size=3),
       meta=st.dictionaries(st.sampled_from(["n", "k", "kt", "chunk", "block", "x"]), meta_values, max_size=5),
       shape=hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=8))
def test_fuzzed_payloads_decode_or_raise_codec_error(codec_id: int, frames: list[bytes], meta: dict[str, Any],
                                                     shape: tuple[int, ...]) -> None:
    payload = Encoded(codec_id, [np.frombuffer(f, np.uint8) for f in frames], meta)
    try:
        out = default_registry().decode(payload, shape, F32)
    except CodecError:
        return
    assert out.shape == shape and np.all(np.isfinite(out))


VALID_PAYLOADS = {
    name: make_codec(spec).encode(np.linspace(-3, 3, 40, dtype=np.float32), info())
    for name, spec in {"dense": {"type": "dense"}, "fp16": {"type": "fp16"}, "int8": {"type": "int8", "block": 8},
                       "bsc": {"type": "bsc", "threshold": 0.2, "size_lower_bound": 0},
                       "sparse2bit": {"type": "sparse2bit", "density": 0.1, "chunk": 16}}.items()}


@settings(max_examples=200, deadline=None)
@given(name=st.sampled_from(sorted(VALID_PAYLOADS)), data=st.data())
def test_mutated_valid_payloads_decode_or_raise_codec_error(name: str, data: st.DataObject) -> None:
    """Right frame count and lengths, garbage inside (or one meta field changed): still only CodecError."""
    valid = VALID_PAYLOADS[name]
    frames = [f.copy() for f in valid.frames]
    meta = dict(valid.meta)
    if data.draw(st.booleans()) or not meta:
        which = data.draw(st.integers(0, len(frames) - 1))
        raw = data.draw(st.binary(min_size=frames[which].nbytes, max_size=frames[which].nbytes))
        frames[which] = np.frombuffer(raw, np.uint8)
    else:
        meta[data.draw(st.sampled_from(sorted(meta)))] = data.draw(meta_values)
    try:
        out = default_registry().decode(Encoded(valid.codec_id, frames, meta), (40,), F32)
    except CodecError:
        return
    assert out.shape == (40,) and np.all(np.isfinite(out))


# ---- registry -----------------------------------------------------------------------------------------

class _Stub(Codec):
    name: ClassVar[str] = "stub"
    codec_id: ClassVar[int] = 60

    def encode(self, array: np.ndarray, info: TensorInfo) -> Encoded:
        return Encoded(self.codec_id, [], {})

    def decode(self, encoded: Encoded, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
        return np.zeros(shape, dtype)

    def estimate_ratio(self, numel: int, dtype: Any) -> float:
        return 0.0


def test_registry_refuses_duplicate_names_and_ids() -> None:
    registry = default_registry()
    registry.register(_Stub)
    with pytest.raises(CodecError, match="name 'stub' is already registered"):
        registry.register(type("Again", (_Stub,), {"codec_id": 61}))
    with pytest.raises(CodecError, match=r"id 60 .* already taken"):
        registry.register(type("SameId", (_Stub,), {"name": "other"}))
    with pytest.raises(CodecError, match=r"id 0 .* already taken by Dense"):
        registry.register(type("ClaimsDense", (_Stub,), {"name": "fake_dense", "codec_id": 0}))
    with pytest.raises(CodecError, match="codec_id"):
        registry.register(type("BadId", (_Stub,), {"name": "bad_id", "codec_id": -7}))
    with pytest.raises(CodecError, match=r"BigId.codec_id must be in \[0, 63\] .* got 64"):
        registry.register(type("BigId", (_Stub,), {"name": "big_id", "codec_id": MAX_CODEC_ID + 1}))
    with pytest.raises(TypeError):
        registry.register(int)  # type: ignore[arg-type]
    registry.register(type("Composite2", (ErrorFeedback,), {"name": "ef2"}))  # composites share COMPOSITE_ID
    assert "stub" not in default_registry().names()  # every default registry is fresh


def test_registry_lookups() -> None:
    registry = default_registry()
    assert registry.codec_class("bsc") is BSC and registry.codec_class(2) is BSC
    assert registry.codec_class("FP16") is FP16 and registry.codec_class(3) is Int8
    assert registry.names() == ["bf16", "bsc", "dense", "error_feedback", "fp16", "int8", "mpq", "size_adaptive",
                                "sparse2bit"]
    assert registry.codec_class(4) is BF16 and registry.codec_class(5) is Sparse2Bit
    with pytest.raises(CodecError, match="known"):
        registry.codec_class("2bit")
    with pytest.raises(CodecError, match="unknown codec id"):
        registry.decoder(COMPOSITE_ID)


@pytest.mark.parametrize(("spec", "message"), [
    ({"type": "bsc", "thresh": 0.1}, r"no parameter 'thresh'; valid: \['exact', 'momentum', 'seed', "
                                     r"'size_lower_bound', 'threshold', 'warmup_steps'\]"),
    ({"type": "int8", "block": 256, "bits": 4}, r"valid: \['block'\]"),
    ({"type": "bsc", "threshold": "0.01"}, "finite number"),
    ({"type": "bsc", "threshold": math.nan}, "finite number"),
    ({"type": "bsc", "threshold": 0}, r"\(0, 1\]"),
    ({"type": "bsc", "threshold": 1.5}, r"\(0, 1\]"),
    ({"type": "bsc", "momentum": 1.0}, r"\[0, 1\)"),
    ({"type": "bsc", "warmup_steps": True}, "integer"),
    ({"type": "bsc", "warmup_steps": 2.5}, "integer"),
    ({"type": "bsc", "exact": 1}, "true or false"),
    ({"type": "bsc", "size_lower_bound": -1}, ">= 0"),
    ({"type": "mpq", "size_lower_bound": "big"}, "codec 'mpq' parameter size_lower_bound='big' must be an integer"),
    ({"type": "mpq", "block": 4}, "codec 'mpq' has no parameter 'block'"),
    ({"type": "int8", "block": 0}, "block"),
    ({"type": "error_feedback"}, "needs parameter 'inner'"),
    ({"type": "error_feedback", "inner": 3}, "nested spec"),  # a name alone is a spec: "int8"
    ({"type": "error_feedback", "inner": {"type": "nope"}}, "unknown codec 'nope'"),
    ({"type": "2bit", "threshold": 0.5}, "unknown codec"),
    ({"threshold": 0.5}, "type"),
])
def test_bad_specs_raise_codec_error_saying_what_is_valid(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(CodecError, match=message):
        make_codec(spec)


def test_specs_build_configured_codecs() -> None:
    bsc = make_codec({"type": "bsc", "threshold": 0.001, "momentum": 0, "warmup_steps": 5, "exact": True,
                      "size_lower_bound": 0})
    assert isinstance(bsc, BSC)
    assert (bsc.threshold, bsc.momentum, bsc.warmup_steps, bsc.exact) == (0.001, 0.0, 5, True)
    assert isinstance(make_codec({"type": "fp16"}), FP16)
    ef = make_codec({"type": "error_feedback", "inner": {"type": "int8", "block": 64}})
    assert isinstance(ef, ErrorFeedback) and isinstance(ef.inner, Int8) and ef.inner.block == 64
    assert isinstance(Registry().register(FP16), type)
