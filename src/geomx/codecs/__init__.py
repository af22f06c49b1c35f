"""WAN compression codecs: pure NumPy in, NumPy out; the server and transport plug them in.

Built-ins (spec ``{"type": name, ...}``; wire id in brackets):

* ``dense`` [0] — raw bytes (wire.py's DENSE).
* ``fp16`` [1] — float16 on the wire, saturating at ±65504.
* ``bsc`` [2] — Bi-Sparse: DGC top-k with error feedback both ways (``momentum`` > 0: DGC's momentum
  correction on push, for loops that step plain SGD on the aggregate);
  the spec adds GeoMX's size gate (tensors below ``size_lower_bound`` go dense).
* ``int8`` [3] — per-block absmax int8; use inside ``error_feedback``.
* ``bf16`` [4] — bfloat16 on the wire, rounded to nearest even: exact for a bfloat16 model's values.
* ``sparse2bit`` [5] — SparseLoCo's pseudo-gradient codec: top-k per chunk, 2-bit values on two levels per chunk,
  an exact residual both ways (``density`` 0.02, ``chunk`` 4096: 0.036 bytes per element).
* ``error_feedback``, ``size_adaptive``, ``mpq`` — composites; their payloads carry the id of the
  codec that encoded them.

Modules: ``base`` (the ``Codec`` interface, ``Encoded`` payloads, their checks), one module per codec above
(``dense``, ``fp16``, ``bsc``, ``int8``, ``bf16``, ``sparse2bit``, ``error_feedback``, ``mpq``; ``composite`` is
``size_adaptive``), ``half`` (float32 <-> float16 at one speed for every value), ``registry`` (names and wire ids
to classes, specs to instances, a worker's compression spec to its codec: ``worker_codec``; a size gate that no
tensor of a model passes: ``idle_size_gate``), ``messages`` (between codec payloads and wire messages).

Usage::

    from geomx.codecs import TensorInfo, make_codec
    codec = make_codec({"type": "mpq", "threshold": 0.01, "size_lower_bound": 200000})
    payload = codec.encode(grad, TensorInfo(key=0, slice=0, kind="gradient", direction="push"))
    grad_hat = codec.decode(payload, grad.shape, grad.dtype)
"""

from .base import COMPOSITE_ID, DENSE_ID, Codec, CodecError, Encoded, TensorInfo
from .bf16 import BF16
from .bsc import BSC, DEFAULT_SIZE_LOWER_BOUND
from .composite import SizeAdaptive
from .dense import Dense
from .error_feedback import ErrorFeedback
from .fp16 import FP16
from .int8 import Int8
from .mpq import MPQ
from .registry import Registry, default_registry, idle_size_gate, make_codec, worker_codec
from .sparse2bit import Sparse2Bit

__all__ = [
    "BF16",
    "BSC",
    "COMPOSITE_ID",
    "DEFAULT_SIZE_LOWER_BOUND",
    "DENSE_ID",
    "FP16",
    "MPQ",
    "Codec",
    "CodecError",
    "Dense",
    "Encoded",
    "ErrorFeedback",
    "Int8",
    "Registry",
    "SizeAdaptive",
    "Sparse2Bit",
    "TensorInfo",
    "default_registry",
    "idle_size_gate",
    "make_codec",
    "worker_codec",
]
