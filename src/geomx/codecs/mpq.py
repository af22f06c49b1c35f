"""MPQ (mixed-precision quantisation), GeoMX's Table 1: tiny tensors fp16 dense, large ones fp32 Bi-Sparse.

Large tensors keep float32 values because they already lose 99% of their entries per round; rounding
the survivors as well would compound the loss. Tiny tensors (biases, norms) are cheap, so they travel
whole at half precision. Payloads carry the id of the part that encoded them (FP16 or BSC).

Usage::

    codec = make_codec({"type": "mpq", "threshold": 0.01, "size_lower_bound": 200000})
    codec.encode(bias, info).codec_id == FP16.codec_id     # and BSC.codec_id for a large tensor
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from .base import Codec, SpecReader
from .bsc import BSC, DEFAULT_SIZE_LOWER_BOUND
from .composite import SizeAdaptive
from .fp16 import FP16


class MPQ(SizeAdaptive):
    """``SizeAdaptive(small=FP16(), large=sparsifier, bound=size_lower_bound)``."""

    name: ClassVar[str] = "mpq"
    size_bound: ClassVar[bool] = True

    def __init__(self, sparsifier: BSC | None = None, size_lower_bound: int = DEFAULT_SIZE_LOWER_BOUND) -> None:
        super().__init__(small=FP16(), large=BSC() if sparsifier is None else sparsifier, bound=size_lower_bound)

    @classmethod
    def from_spec(cls, params: Mapping[str, object], registry: SpecReader) -> Codec:
        """Flat GeoMX-style parameters: the sparsifier's (threshold, momentum, ...) plus ``size_lower_bound``."""
        sparsifier, bound = BSC.split_spec(params, registry, spec_name=cls.name)
        return cls(sparsifier, bound)
