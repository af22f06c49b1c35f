"""SizeAdaptive: one codec for small tensors, another for large ones — the shape of Bi-Sparse and MPQ.

GeoMX sparsifies only tensors with at least ``MXNET_KVSTORE_SIZE_LOWER_BOUND`` elements (the server's
rule is ``numel >= bound``; its MPQ example script says ``>``, we follow the server): indices cost as
much as values, so a 1%-sparse bias vector saves nothing worth its bookkeeping. The payload keeps the id
of the codec that actually encoded it, so the receiver picks the same side without knowing the bound. A
slice is gated by its whole tensor's size when ``TensorInfo.tensor_numel`` says it (servers learn it from
INIT), so ``slice_elems`` never changes which tensors are compressed.

Usage::

    codec = SizeAdaptive(small=None, large=BSC(threshold=0.01), bound=200_000)   # None = dense
    payload = codec.encode(bias, info)              # payload.codec_id == 0 (DENSE) for a small tensor
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

import numpy as np

from .base import COMPOSITE_ID, Codec, CodecError, Encoded, TensorInfo
from .dense import Dense


class SizeAdaptive(Codec):
    """Tensors with ``numel < bound`` go through ``small`` (None: dense), the others through ``large``."""

    name: ClassVar[str] = "size_adaptive"
    codec_id: ClassVar[int] = COMPOSITE_ID

    def __init__(self, small: Codec | None, large: Codec, bound: int) -> None:
        if bound < 0:
            raise CodecError(f"size bound {bound} must be >= 0")
        self.small: Codec = Dense() if small is None else small
        self.large = large
        self.bound = bound

    def pick(self, numel: int) -> Codec:
        """The codec a tensor of ``numel`` elements goes through."""
        return self.small if numel < self.bound else self.large

    def reaches(self, sizes: Iterable[int]) -> bool:
        """Whether any tensor of ``sizes`` (whole tensors' elements) goes through ``large``: a model whose tensors
        are all below the bound gets ``small`` alone (GeoMX's 200000 over a small model), which its owner is told."""
        return any(numel >= self.bound for numel in sizes)

    def choose(self, array: np.ndarray, info: TensorInfo) -> Codec:
        """The codec ``array``, a slice described by ``info``, goes through: by its whole tensor's size."""
        return self.pick(info.gated_numel(array))

    def encode(self, array: np.ndarray, info: TensorInfo) -> Encoded:
        return self.choose(array, info).encode(array, info)

    def decode(self, encoded: Encoded, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
        for codec in (self.small, self.large):
            if encoded.codec_id in codec.wire_ids():
                return codec.decode(encoded, shape, dtype)
        raise CodecError(f"payload has codec id {encoded.codec_id}; {self!r} decodes ids {sorted(self.wire_ids())}")

    def estimate_ratio(self, numel: int, dtype: Any) -> float:
        return self.pick(numel).estimate_ratio(numel, dtype)

    def wire_ids(self) -> frozenset[int]:
        return self.small.wire_ids() | self.large.wire_ids()

    def keeps_residual(self) -> bool:
        return self.small.keeps_residual() or self.large.keeps_residual()

    def reset(self) -> None:
        self.small.reset()
        self.large.reset()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(small={self.small!r}, large={self.large!r}, bound={self.bound})"
