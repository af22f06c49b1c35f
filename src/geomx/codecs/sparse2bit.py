"""Sparse 2-bit ("sparse2bit"): top-k per chunk, each kept value in 2 bits, error feedback on every sender.

SparseLoCo's shape (Templar): a pseudo-gradient (HFA's model delta, or a gradient) is cut into chunks of ``chunk``
consecutive elements; in each chunk the ``k = ceil(density * chunk)`` entries of largest ``|x|`` are kept, where
``x`` is the input plus this sender's residual. A kept value travels as 2 bits: its sign and which of its chunk's
two magnitude levels it takes. Everything not sent (the other entries, and each kept value's quantization error)
stays in the residual, which is the input of the next round: over rounds nothing is lost. The global server's
answer under HFA (the model's change) is compressed the same way with its own residual (direction "pull").

Why two levels per chunk, each a bfloat16:

* **2 bits = sign + level.** A chunk's kept magnitudes are split at their mean; ``hi`` is the mean of those at or
  above it, ``lo`` of those below (one Lloyd step of a 2-level quantizer). Two fitted levels cost 0.35 of one level's
  (the mean |kept|) squared error on Gaussian chunks (measured: 0.5% of the kept values' energy), and a chunk with
  one large outlier does not flatten the rest (its ``lo`` stays at their scale). 4 signed levels of one scale
  (``±s, ±2s``) would waste a level: 98% of a Gaussian chunk's kept magnitudes lie within 1.5x of its threshold.
* **bfloat16 levels: the residual is exact.** A level with 8 significant bits subtracted from a float32 ``x`` with
  ``level / 2 <= |x| < 2**15 * level`` gives an exact float32 (Sterbenz below ``level``, a common grid above it).
  Each value takes the nearest level that satisfies this (``lo`` is capped at twice the chunk's smallest kept
  magnitude, ``hi`` kept above ``max|x| / 2**13``, and in a chunk whose kept values span 2**15 ``lo`` is 0, so one
  always does). So ``residual = x - sent`` holds
  exactly: what was sent plus what is kept is the input, bit for bit in float32. The two levels cost 4 bytes per
  chunk, the same as one float32 scale.

``decay`` (SparseLoCo's beta, default 1: none) scales a push's residual before each round's input is added, so the
residual is a decaying accumulator (the paper's stand-in for outer momentum); the answers' residual is never scaled.
On the quality section's job (60 outer steps) it moved the loss by under 2% either way (``docs/compression.md``).

Bytes at ``density=0.02, chunk=4096``: k = 82 entries of 14 bits (12 for the chunk-local index, 2 for the value)
= 143.5 bytes, plus 4 bytes of levels: 147.5 bytes per 4096 elements, **0.036 bytes per element** (float32 dense:
4). A partial last chunk (``m < chunk`` elements) keeps ``ceil(density * m)`` at the same width: at most 4 bytes of
levels, one entry and one byte of padding beyond 0.036 per element, however the tensor is shaped.

Wire layout: frames ``[levels: uint16 (bfloat16 bits) x 2C (lo, hi per chunk), entries: uint8]``; ``C`` chunks
(the last may be partial); entries: per chunk its ``k`` (last: ``kt``) entries, index ascending, each
``(index << 2) | (negative << 1) | takes_hi`` in ``w = bits(chunk - 1) + 2`` bits, big-endian, packed end to end
and zero-padded to a byte. Meta ``{"n", "chunk", "k", "kt"}``.

Usage::

    codec = Sparse2Bit(density=0.02, chunk=4096)    # or make_codec({"type": "sparse2bit", "density": 0.02})
    answers = Sparse2Bit(density=0.02, pull_density=0.04)  # the server's answers keep two parties' union
    payload = codec.encode(delta, TensorInfo(key=3, slice=0, kind="delta", direction="push"))
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np

from .base import (
    CodecError,
    Encoded,
    ResidualCodec,
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

MAX_CHUNK = 1 << 16  # entries of at most 18 bits: a uint32 holds one
BF16_MAX_BITS = 0x7F7F  # the largest finite bfloat16
SPREAD = 2.0**15  # a value taking a level below 1 / SPREAD of it would not subtract exactly


def keep_count(density: float, m: int) -> int:
    """Entries kept of a chunk of ``m`` elements: ``ceil(density * m)``, at least 1, at most m (0 for m = 0)."""
    return 0 if m == 0 else min(m, max(1, math.ceil(density * m - 1e-9)))


def index_bits(chunk: int) -> int:
    """Bits of a chunk-local index (at least 1)."""
    return max(1, (chunk - 1).bit_length())


def _bf16_nearest(values: np.ndarray) -> np.ndarray:
    """Non-negative finite float32 values rounded to bfloat16 (nearest, ties to even; above its range: its largest)
    as float32."""
    bits = np.ascontiguousarray(values, np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) & np.uint32(0xFFFF0000)
    rounded = np.minimum(rounded, np.uint32(BF16_MAX_BITS << 16))
    return rounded.view(np.float32)


def _bf16_down(values: np.ndarray) -> np.ndarray:
    """Non-negative finite float32 values rounded down to bfloat16 (truncated), as float32."""
    bits = np.ascontiguousarray(values, np.float32).view(np.uint32)
    return (bits & np.uint32(0xFFFF0000)).view(np.float32)


def select(rows: np.ndarray, k: int) -> np.ndarray:
    """Column of each row's ``k`` largest ``|value|`` as an (R, k) array, ascending in each row (ties: the first).

    A row with at most k non-zeros keeps them all and its first zeros (the global server's answers: a sum of the
    parties' sparse deltas is mostly zeros, and a partition of a row of zeros is several times slower than of a
    dense one). Other rows: one ``np.partition`` per row finds the k-th largest magnitude; rows with exactly k at
    or above it take those, rows with ties at it those above it and the first of those equal to it."""
    r, c = rows.shape
    if k == c:
        return np.broadcast_to(np.arange(c), (r, c)).copy()
    magnitude = np.abs(rows)
    count = np.count_nonzero(rows, axis=1)
    sparse = count <= k
    if not sparse.any():
        mask = _top(magnitude, k)
    else:
        mask = nonzero = magnitude != 0
        dense = np.flatnonzero(~sparse)
        if dense.size:
            mask[dense] = _top(magnitude[dense], k)
        few = np.flatnonzero(sparse)
        # its first k - count zeros lie among its first k columns (those hold at most count non-zeros)
        zeros = ~nonzero[few, :k]
        mask[few, :k] |= zeros & (np.cumsum(zeros, axis=1, dtype=np.int32) <= (k - count[few])[:, None])
    return (np.flatnonzero(mask) % c).reshape(r, k)


def _top(magnitude: np.ndarray, k: int) -> np.ndarray:
    """Each row's mask of exactly ``k`` of its largest entries (ties at the k-th largest: the first of them)."""
    c = magnitude.shape[1]
    threshold = np.partition(magnitude, c - k, axis=1)[:, c - k]
    mask = magnitude >= threshold[:, None]
    tied = np.flatnonzero(np.count_nonzero(mask, axis=1) != k)  # more than k at or above it (never fewer)
    if tied.size:
        level = threshold[tied][:, None]
        above, equal = magnitude[tied] > level, magnitude[tied] == level
        wanted = k - np.count_nonzero(above, axis=1)  # at most k - 1 lie strictly above the k-th largest
        mask[tied] = above | (equal & (np.cumsum(equal, axis=1, dtype=np.int32) <= wanted[:, None]))
    return mask


def levels(kept: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's (lo, hi) magnitude levels for its kept values (R, k), bfloat16 as float32; the rule is the module
    docstring's."""
    a = np.abs(kept).astype(np.float64)
    mean = a.mean(axis=1, keepdims=True)
    upper = (a >= mean) | (a == a.max(axis=1, keepdims=True))
    count_up = upper.sum(axis=1)
    sum_up = np.where(upper, a, 0).sum(axis=1)
    hi_mean = sum_up / count_up
    count_lo = a.shape[1] - count_up
    lo_mean = np.where(count_lo > 0, (a.sum(axis=1) - sum_up) / np.maximum(count_lo, 1), hi_mean)
    a_max, a_min = a.max(axis=1), a.min(axis=1)
    hi = np.maximum(_bf16_nearest(hi_mean.astype(np.float32)), _bf16_nearest((a_max / 2**13).astype(np.float32)))
    twice_min = np.minimum(2 * a_min, float(np.finfo(np.float32).max)).astype(np.float32)
    lo = np.minimum(_bf16_nearest(np.minimum(lo_mean, hi_mean).astype(np.float32)), _bf16_down(twice_min))
    return lo, hi


def _takes_hi(a: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Which magnitudes ``a`` (R, k; float64) take ``hi``: those at least half of it and nearer to it than to lo."""
    lo64, hi64 = lo.astype(np.float64)[:, None], hi.astype(np.float64)[:, None]
    return (2 * a >= hi64) & (np.abs(a - hi64) < np.abs(a - lo64))


def quantize(kept: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(lo, codes, sent) for kept values (R, k): code ``(negative << 1) | takes_hi``, sent the float32 value decoded.

    A value takes ``hi`` if it is nearer and at least half of it, otherwise ``lo``. ``lo`` is at most twice the
    smallest kept magnitude; in a chunk where a value taking it is ``SPREAD`` times larger or more (its kept values
    span 2**15), ``lo`` becomes 0: then every value's difference to its level is exact (module docstring)."""
    a = np.abs(kept).astype(np.float64)
    takes_hi = _takes_hi(a, lo, hi)
    spread = np.flatnonzero(np.any(~takes_hi & (a >= SPREAD * lo.astype(np.float64)[:, None]), axis=1))
    if spread.size:
        lo = lo.copy()
        lo[spread] = 0
        takes_hi[spread] = _takes_hi(a[spread], lo[spread], hi[spread])
    negative = kept < 0
    magnitude = np.where(takes_hi, hi[:, None], lo[:, None])
    sent = np.where(negative, -magnitude, magnitude).astype(np.float32)
    return lo, (negative.astype(np.uint32) << 1) | takes_hi.astype(np.uint32), sent


def pack(entries: np.ndarray, width: int) -> np.ndarray:
    """uint32 entries, each in its low ``width`` bits, packed end to end (big-endian), zero-padded to a byte."""
    bits = np.unpackbits(entries.astype(">u4").view(np.uint8).reshape(-1, 4), axis=1)
    return np.packbits(bits[:, 32 - width:].reshape(-1))


def unpack(packed: np.ndarray, count: int, width: int) -> np.ndarray:
    """The ``count`` uint32 entries of ``width`` bits that ``pack`` made; CodecError if its padding is not zero."""
    bits = np.unpackbits(packed)
    if bits[count * width:].any():
        raise CodecError("sparse2bit entries: the padding after the last entry must be zero bits")
    wide = np.zeros((count, 32), np.uint8)
    wide[:, 32 - width:] = bits[:count * width].reshape(count, width)
    return np.packbits(wide, axis=1).view(">u4").reshape(-1).astype(np.uint32)


class Sparse2Bit(ResidualCodec):
    """Top-k per chunk, 2-bit values on two bfloat16 levels per chunk, an exact residual per (key, slice, direction).
    """

    name: ClassVar[str] = "sparse2bit"
    codec_id: ClassVar[int] = 5
    meta_fields: ClassVar[tuple[str, ...]] = ("n", "chunk", "k", "kt")  # on the wire: 16 bytes, not 51 of JSON

    def __init__(self, density: float = 0.02, chunk: int = 4096, pull_density: float = 0.0,
                 decay: float = 1.0) -> None:
        if not 0 < density <= 1:
            raise CodecError(f"sparse2bit density={density} is the fraction of each chunk kept: it must be in (0, 1]")
        if not 0 <= pull_density <= 1:
            raise CodecError(f"sparse2bit pull_density={pull_density} must be in [0, 1] (0: the push's density)")
        if not 0 < decay <= 1:
            raise CodecError(f"sparse2bit decay={decay} scales a push's residual each round: it must be in (0, 1]")
        if not 1 <= chunk <= MAX_CHUNK:
            raise CodecError(f"sparse2bit chunk={chunk} must be in [1, {MAX_CHUNK}]")
        super().__init__()
        self.density = density
        # the global server's answer (direction pull) is the sum of every party's sparse delta: their union holds up
        # to P times ``density`` of a chunk, and re-sparsified at ``density`` half of two parties' signal waited in
        # the server's residual (charlm tiny, H = 5: 1.987 against 1.914 with dense answers). 0: ``density``.
        self.pull_density = pull_density or density
        self.chunk = chunk
        self.decay = decay

    def encode(self, array: np.ndarray, info: TensorInfo) -> Encoded:
        """x = input + residual; keep, quantize, and leave ``x - sent`` as the residual (in place: x becomes it)."""
        check_kind(info, self.name)
        g = float_vector(array, f"key {info.key} slice {info.slice}")
        check_finite(g, f"key {info.key} slice {info.slice}")  # before touching the state
        residual = self._residuals.get(info, g.size)
        if residual is not None and self.decay != 1.0 and info.direction != "pull":
            residual *= np.float32(self.decay)
        x = g.copy() if residual is None else np.add(residual, g, out=residual)
        n, chunk = x.size, self.chunk
        full = n // chunk * chunk
        density = self.pull_density if info.direction == "pull" else self.density
        k, kt = keep_count(density, chunk), keep_count(density, n - full)
        parts = [(x[:full].reshape(-1, chunk), k, 0)] if full else []
        if n > full:
            parts.append((x[full:].reshape(1, -1), kt, full))
        level_pairs, entries = [], []
        for rows, keep, start in parts:
            columns = select(rows, keep)
            kept = np.take_along_axis(rows, columns, axis=1)
            lo, hi = levels(kept)
            lo, codes, sent = quantize(kept, lo, hi)
            positions = (start + chunk * np.arange(rows.shape[0])[:, None] + columns).reshape(-1)
            x[positions] -= sent.reshape(-1)  # exact (module docstring): the residual is what was not sent
            level_pairs.append(np.stack([lo, hi], axis=1).reshape(-1))
            entries.append(((columns.astype(np.uint32) << 2) | codes).reshape(-1))
        self._residuals.put(info, x)
        pairs = np.concatenate(level_pairs) if level_pairs else np.zeros(0, np.float32)
        packed = pack(np.concatenate(entries) if entries else np.zeros(0, np.uint32), index_bits(chunk) + 2)
        frames = [(pairs.view(np.uint32) >> 16).astype(np.uint16), packed]
        return Encoded(self.codec_id, frames, {"n": n, "chunk": chunk, "k": k, "kt": kt})

    def decode(self, encoded: Encoded, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
        check_id(encoded, self)
        numel, dtype = output_size(shape, dtype)
        check_frame_count(encoded, 2, self.name)
        check_meta_n(encoded, numel)
        chunk = meta_int(encoded, "chunk", 1, MAX_CHUNK)
        k = meta_int(encoded, "k", 1, chunk)
        rows, tail = divmod(numel, chunk)
        kt = meta_int(encoded, "kt", min(tail, 1), tail)
        chunks = rows + (1 if tail else 0)
        raw = frame_as(encoded.frames[0], np.uint16, 2 * chunks, "sparse2bit levels")
        count, width = rows * k + kt, index_bits(chunk) + 2
        packed = frame_as(encoded.frames[1], np.uint8, -(-count * width // 8), "sparse2bit entries")
        lo, hi = _checked_levels(raw)
        entries = unpack(packed, count, width)
        index, codes = (entries >> 2).astype(np.int64), entries & np.uint32(3)
        out = np.zeros(numel, np.float32)
        for first, last, keep, size, row0 in ((0, rows * k, k, chunk, 0), (rows * k, count, kt, tail, rows)):
            if last == first:
                continue
            block = index[first:last].reshape(-1, keep)
            _check_indices(block, size, row0)
            chunk_of = np.arange(row0, row0 + block.shape[0])[:, None]
            level = np.where(codes[first:last].reshape(-1, keep) & 1, hi[chunk_of], lo[chunk_of])
            signed = np.where(codes[first:last].reshape(-1, keep) & 2, -level, level)
            out[(chunk_of * chunk + block).reshape(-1)] = signed.reshape(-1)
        return to_dtype(out, dtype, owned=True).reshape(shape)

    def estimate_ratio(self, numel: int, dtype: Any) -> float:
        """A push's encoded bytes over dense: 4 bytes of levels per chunk, the packed entries and the meta's frame
        (on the wire: ``codecs.messages``)."""
        if numel == 0:
            return 1.0
        rows, tail = divmod(numel, self.chunk)
        count = rows * keep_count(self.density, self.chunk) + keep_count(self.density, tail)
        chunks = rows + (1 if tail else 0)
        nbytes = 4 * chunks + -(-count * (index_bits(self.chunk) + 2) // 8) + 4 * len(self.meta_fields)
        return nbytes / (numel * int(np.dtype(dtype).itemsize))

    def __repr__(self) -> str:
        decay = f", decay={self.decay}" if self.decay != 1.0 else ""
        return f"Sparse2Bit(density={self.density}, chunk={self.chunk}, pull_density={self.pull_density}{decay})"


def _checked_levels(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi) per chunk as float32 from their bfloat16 bits; CodecError naming a bad scale."""
    pairs = raw.reshape(-1, 2)
    bad = np.flatnonzero(((pairs & 0x8000) != 0).any(axis=1))
    if bad.size:
        raise CodecError(f"sparse2bit scale of chunk {bad[0]} is negative: levels are magnitudes")
    bad = np.flatnonzero(((pairs & 0x7F80) == 0x7F80).any(axis=1))
    if bad.size:
        raise CodecError(f"sparse2bit scale of chunk {bad[0]} is not finite (inf or NaN)")
    bad = np.flatnonzero(pairs[:, 0] > pairs[:, 1])
    if bad.size:
        raise CodecError(f"sparse2bit scale of chunk {bad[0]}: its low level is above its high level")
    as_float = (pairs.astype(np.uint32) << 16).view(np.float32)
    return as_float[:, 0], as_float[:, 1]


def _check_indices(block: np.ndarray, size: int, row0: int) -> None:
    """Chunk-local indices (one row per chunk) inside the chunk and strictly increasing; CodecError names the chunk."""
    bad = np.argwhere(block >= size)
    if bad.size:
        row, column = bad[0]
        raise CodecError(f"sparse2bit index {block[row, column]} of chunk {row0 + row} is out of range [0, {size})")
    bad = np.argwhere(np.diff(block, axis=1) <= 0)
    if bad.size:
        raise CodecError(f"sparse2bit indices of chunk {row0 + bad[0][0]} must be strictly increasing")
