"""Bi-Sparse ("bsc"): DGC-style top-k sparsification of gradients, on the push AND the pull side.

Push (a local server's summed gradient ``g`` for one key slice): plain error feedback by default, or
with ``momentum > 0`` the momentum correction and momentum factor masking of Deep Gradient Compression
(Lin et al., 2018)::

    u = momentum * u + g          # velocity (momentum = 0: u = g)
    v = v + u                     # accumulated velocity: everything not sent yet (the residual)
    S = the k entries of largest |v|, k = max(1, int(n * fraction))
    send (S, v[S]);  u[S] = 0;  v[S] = 0

Which default. GeoMX hard-codes the momentum correction (0.9), and its examples step Adam on the pulled
aggregate: a second momentum on top, and Adam's per-coordinate scaling of residuals released in bursts.
Measured with the seeds' loop (digits MLP 64-1024-1024-10, 2 x 2 workers, 1%, Adam lr 0.003; benchmarks/README.md,
"Bi-Sparse's momentum correction"), momentum 0.9 reached 0.53-0.56 after 88 steps, momentum 0 0.84-0.86; plain SGD
(lr 0.2) on the aggregate needs the correction (MLP 0.93-0.95 against 0.93, DigitsCNN 0.94 against 0.75).
So the default is 0, what any optimizer with its own momentum expects (the true aggregate, delayed by the
residual); a loop that steps plain SGD on the aggregate asks for ``momentum=0.9`` (``examples/cnn_bsc.py``
and ``cnn_mpq.py`` do).

A pushed ``delta`` (HFA's model change, which local optimizer steps produced) gets no momentum: plain
error feedback, ``v = v + g``.

Pull (the global server's aggregate, direction "pull"): the same sparsifier with ``momentum = 0``, so
``v`` is a plain error-feedback residual; pull bytes ≈ push bytes. (GeoMX instead re-sends every
non-zero of the sum of P parties' sparse pushes, up to P·k entries, with no residual.)

Selection (``exact=False``, the default) estimates the k-th largest |v| from a random sample and scans:

1. sample ``s = max(2048, ceil(0.01 n), ceil(128 n / k))`` positions (with replacement, from this
   instance's seeded generator — a fresh sample every call), so the sample holds >= 128 expected picks;
   if ``2 s > n`` sampling saves nothing and the exact path runs instead;
2. ``t`` = the ``j``-th largest sampled |v|, with ``j = ceil(k_s + 3 sqrt(k_s))`` and ``k_s = k s / n``:
   deliberately 3 standard deviations below the estimated k-th magnitude, so that with probability
   ≈ 99.9% at least k elements pass;
3. candidates = every ``|v| >= t`` (and ``> 0``); if more than k, keep the k largest of them (an
   argpartition over ~1.3 k candidates). The result is then *exactly* the top k. Otherwise all the
   candidates are sent: slightly fewer than k (in the ≈ 0.1% case).

``exact=True`` runs ``np.argpartition`` over all n (deterministic; used by the replay test).
Entries whose accumulated value is exactly 0 are never sent, in both modes. Indices travel sorted and
as integers (int32 when n < 2**31, else int64) — never as floats, which lose exactness above 2**24.

Warm-up (``warmup_steps = W > 0``): the kept fraction at a slice's step ``i < W`` is
``threshold ** (i / W)`` — 1.0 (everything) at step 0, falling exponentially to ``threshold`` at
step W. Whenever ``2k >= n`` the indices would cost more than they save, so all n values travel in
order with an empty index frame (meta ``k == n``).

Wire layout: frames ``[indices: int32|int64 × k, values: float32 × k]``, meta ``{"n", "k"}``.
Tensors below ``size_lower_bound`` are not this class's business: the spec ``{"type": "bsc"}`` builds
``SizeAdaptive(small=None, large=BSC(...), bound=size_lower_bound)``, which sends them dense.

Usage::

    codec = BSC(threshold=0.01)                      # or make_codec({"type": "bsc", "threshold": 0.01})
    payload = codec.encode(grad, TensorInfo(key=3, slice=0, kind="gradient", direction="push"))
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from .base import (
    Codec,
    CodecError,
    Encoded,
    SliceStates,
    SpecReader,
    TensorInfo,
    check_finite,
    check_frame_count,
    check_id,
    check_kind,
    check_meta_n,
    float_vector,
    frame_as,
    meta_int,
    output_size,
    to_dtype,
)
from .composite import SizeAdaptive

DEFAULT_SIZE_LOWER_BOUND = 200_000  # GeoMX's documented MXNET_KVSTORE_SIZE_LOWER_BOUND example
MIN_SAMPLE = 2048
SAMPLE_RATE = 0.01
MIN_SAMPLE_PICKS = 128
SAMPLE_MARGIN_SD = 3.0


def index_dtype(n: int) -> np.dtype[Any]:
    """Indices of a tensor of n elements: int32 while they fit, int64 beyond."""
    return np.dtype(np.int32) if n < 2**31 else np.dtype(np.int64)


def top_k_exact(magnitude: np.ndarray, k: int) -> np.ndarray:
    """Positions of the k largest entries of ``magnitude`` (unordered; 1 <= k <= n), by introselect over all n."""
    n = magnitude.size
    return np.argpartition(magnitude, n - k)[n - k:]


def top_k_sampled(magnitude: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """Positions of (almost always exactly) the k largest entries (1 <= k <= n), via a sampled threshold.

    The rule is in the module docstring. Positions are unordered; ``magnitude`` must be non-negative.
    """
    n = magnitude.size
    s = min(n, max(MIN_SAMPLE, math.ceil(SAMPLE_RATE * n), math.ceil(MIN_SAMPLE_PICKS * n / k)))
    if 2 * s > n:
        return top_k_exact(magnitude, k)
    picks = k * s / n
    j = min(s, math.ceil(picks + SAMPLE_MARGIN_SD * math.sqrt(picks)))
    sample = magnitude[rng.integers(0, n, size=s)]
    threshold = np.partition(sample, s - j)[s - j]
    candidates = np.flatnonzero(magnitude >= threshold if threshold > 0 else magnitude > 0)
    if candidates.size > k:
        candidates = candidates[top_k_exact(magnitude[candidates], k)]
    return candidates


@dataclass
class _ResidualState:
    """One slice's sparsifier state. ``velocity`` is None on the pull side (no momentum)."""

    velocity: np.ndarray | None
    accumulated: np.ndarray
    step: int = 0


class BSC(Codec):
    """Top-k sparsifier with momentum correction (push), error feedback (both sides) and warm-up."""

    name: ClassVar[str] = "bsc"
    codec_id: ClassVar[int] = 2
    size_bound: ClassVar[bool] = True  # the spec's size_lower_bound gates whole tensors (from_spec)

    def __init__(self, threshold: float = 0.01, momentum: float = 0.0, exact: bool = False,
                 warmup_steps: int = 0, seed: int = 0) -> None:
        if not 0 < threshold <= 1:
            raise CodecError(f"bsc threshold={threshold} is the fraction of elements kept: it must be in (0, 1]")
        if not 0 <= momentum < 1:
            raise CodecError(f"bsc momentum={momentum} must be in [0, 1)")
        if warmup_steps < 0:
            raise CodecError(f"bsc warmup_steps={warmup_steps} must be >= 0")
        self.threshold = threshold
        self.momentum = momentum
        self.exact = exact
        self.warmup_steps = warmup_steps
        self.seed = seed
        self._rng = np.random.default_rng(seed)
        self._state: SliceStates[_ResidualState] = SliceStates(lambda state: int(state.accumulated.size))

    @classmethod
    def split_spec(cls, params: Mapping[str, object], registry: SpecReader, spec_name: str = "bsc") -> tuple[BSC, int]:
        """A sparsifier from spec parameters plus ``size_lower_bound`` (shared by "bsc" and "mpq")."""
        kwargs = registry.constructor_kwargs(cls, params, extra={"size_lower_bound": int}, spec_name=spec_name)
        bound = kwargs.pop("size_lower_bound", DEFAULT_SIZE_LOWER_BOUND)
        if bound < 0:
            raise CodecError(f"size_lower_bound={bound} must be >= 0")
        return cls(**kwargs), bound

    @classmethod
    def from_spec(cls, params: Mapping[str, object], registry: SpecReader) -> Codec:
        """``{"type": "bsc"}`` is GeoMX's Bi-Sparse: tensors below ``size_lower_bound`` travel dense."""
        sparsifier, bound = cls.split_spec(params, registry)
        return SizeAdaptive(small=None, large=sparsifier, bound=bound) if bound > 0 else sparsifier

    def fraction(self, step: int) -> float:
        """The fraction of elements kept at a slice's ``step`` (0-based), warm-up included."""
        if step < self.warmup_steps:
            return float(self.threshold ** (step / self.warmup_steps))
        return self.threshold

    def encode(self, array: np.ndarray, info: TensorInfo) -> Encoded:
        check_kind(info, self.name)
        g = float_vector(array, f"key {info.key} slice {info.slice}")
        check_finite(g, f"key {info.key} slice {info.slice}")  # before touching the state
        n = g.size
        state = self._state_of(info, n)
        v = state.accumulated
        if state.velocity is not None:
            u = state.velocity
            u *= np.float32(self.momentum)
            u += g
            v += u
        else:
            v += g
        k = max(1, int(n * self.fraction(state.step))) if n else 0
        state.step += 1
        if 2 * k >= n:  # indices would cost more than they save: send everything, in order
            values = v.copy()
            v.fill(0)
            if state.velocity is not None:
                state.velocity.fill(0)
            return Encoded(self.codec_id, [np.zeros(0, index_dtype(n)), values], {"n": n, "k": n})
        magnitude = np.abs(v)
        chosen = top_k_exact(magnitude, k) if self.exact else top_k_sampled(magnitude, k, self._rng)
        chosen = chosen[magnitude[chosen] > 0]  # zeros carry nothing
        chosen.sort()
        values = v[chosen]
        v[chosen] = 0
        if state.velocity is not None:
            state.velocity[chosen] = 0  # momentum factor masking
        return Encoded(self.codec_id, [chosen.astype(index_dtype(n)), values], {"n": n, "k": chosen.size})

    def decode(self, encoded: Encoded, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
        check_id(encoded, self)
        numel, dtype = output_size(shape, dtype)
        check_frame_count(encoded, 2, self.name)
        check_meta_n(encoded, numel)
        k = meta_int(encoded, "k", 0, numel)
        values = frame_as(encoded.frames[1], np.float32, k, "bsc values")
        check_finite(values, "bsc values")
        if k == numel:  # the dense layout: no indices
            frame_as(encoded.frames[0], index_dtype(numel), 0, "bsc indices (dense layout: none)")
            return to_dtype(values, dtype, owned=False).reshape(shape)
        indices = frame_as(encoded.frames[0], index_dtype(numel), k, "bsc indices")
        if k:
            if indices[0] < 0 or indices[-1] >= numel:
                raise CodecError(f"bsc indices must lie in [0, {numel}); got first {indices[0]}, last {indices[-1]}")
            if np.any(indices[1:] <= indices[:-1]):  # comparisons, not differences: no integer overflow
                raise CodecError("bsc indices must be strictly increasing (sorted, no duplicates)")
        out = np.zeros(numel, np.float32)
        out[indices] = values
        return to_dtype(out, dtype, owned=True).reshape(shape)

    def estimate_ratio(self, numel: int, dtype: Any) -> float:
        """Steady state (after warm-up): k values as float32 plus k indices, or all values if denser."""
        if numel == 0:
            return 1.0
        itemsize = int(np.dtype(dtype).itemsize)
        k = max(1, int(numel * self.threshold))
        if 2 * k >= numel:
            return 4 / itemsize
        return k * (4 + int(index_dtype(numel).itemsize)) / (numel * itemsize)

    def keeps_residual(self) -> bool:
        return True

    def pending(self, info: TensorInfo) -> np.ndarray | None:
        """A copy of the slice's accumulated, not yet sent values (flat float32), or None before its first encode."""
        state = self._state.peek(info)
        return None if state is None else state.accumulated.copy()

    def reset(self) -> None:
        self._state.clear()

    def _state_of(self, info: TensorInfo, n: int) -> _ResidualState:
        state = self._state.get(info, n)
        if state is None:
            # Momentum correction stands in for the optimizer's momentum on raw gradients. A delta (HFA's
            # model change after local optimizer steps) already carries the optimizer's momentum; adding
            # more would overshoot, so deltas get plain error feedback.
            with_momentum = info.direction == "push" and info.kind == "gradient" and self.momentum > 0
            velocity = np.zeros(n, np.float32) if with_momentum else None
            state = _ResidualState(velocity=velocity, accumulated=np.zeros(n, np.float32))
            self._state.put(info, state)
        return state

    def __repr__(self) -> str:
        return (f"BSC(threshold={self.threshold}, momentum={self.momentum}, exact={self.exact}, "
                f"warmup_steps={self.warmup_steps}, seed={self.seed})")
