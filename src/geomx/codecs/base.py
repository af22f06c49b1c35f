"""The codec interface shared by every WAN compressor, and the payload checks they all need.

A codec turns one tensor slice into an ``Encoded`` payload — a codec id, a few contiguous NumPy frames
(each becomes one wire frame) and a tiny JSON-safe ``meta`` — and back. The id travels in the message
header, so a receiver decodes without negotiation. Two rules keep that true:

* ``decode`` is a pure function of ``(encoded, shape, dtype)``: it never reads the instance's
  configuration or state, so any instance of the class that owns the id can decode (see
  ``Registry.decoder``). Everything the decoder needs (block size, k, ...) is in ``meta``.
* ``decode`` trusts nothing: frames arrive from the network, so their number, byte lengths, meta fields,
  index ranges and the finiteness of values are checked, and any problem raises ``CodecError`` before
  memory proportional to a claimed size is allocated.

Stateful codecs (momentum, residuals) keep their state per ``(key, slice, direction)`` inside the
instance, in a ``SliceStates`` (residual carriers: ``ResidualCodec``, whose ``Residuals`` is one). Two threads
may encode different slices at once; one slice must not be encoded concurrently.

Usage::

    payload = codec.encode(grad, TensorInfo(key=3, slice=0, kind="gradient", direction="push"))
    grad_hat = codec.decode(payload, grad.shape, np.dtype(np.float32))
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Literal, Protocol, TypeVar

import numpy as np

from .half import from_half, to_half

DENSE_ID = 0  # raw bytes in the header's dtype; wire.py's CodecId.DENSE
COMPOSITE_ID = -1  # a codec that never appears on the wire: its payloads carry the id of the part that encoded
MAX_DECODE_BYTES = 1 << 31  # the largest tensor a payload may ask us to allocate (wire.py's default limit)

FLOAT_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))

TensorKind = Literal["gradient", "weights", "delta"]
Direction = Literal["push", "pull"]
StateKey = tuple[int, int, str]  # (key, slice, direction): where stateful codecs keep their state
MetaValue = int | float | str
S = TypeVar("S")  # what a stateful codec keeps per slice (SliceStates)


class SpecReader(Protocol):
    """What ``Codec.from_spec`` needs of the registry (``Registry`` is one): a spec's parameters checked against a
    codec's constructor. A protocol here, so the codecs never import the registry that imports them."""

    def constructor_kwargs(self, cls: type[Codec], params: Mapping[str, object],
                           extra: Mapping[str, type] | None = None, spec_name: str | None = None) -> dict[str, Any]:
        """``params`` as ``cls``'s keyword arguments, or CodecError naming what is wrong."""
        ...


class CodecError(ValueError):
    """A tensor a codec cannot encode, a payload it must not decode, or an invalid codec spec."""


@dataclass(frozen=True)
class TensorInfo:
    """What a tensor slice is, so codecs can keep per-slice state and refuse what makes no sense for them.

    ``kind``: "gradient" (a sum of gradients), "delta" (a change of weights, additive over rounds) or
    "weights" (absolute values: not additive, so residual-carrying codecs refuse them).
    ``direction``: "push" (local server → global server) or "pull" (the reply).
    ``tensor_numel``: the elements of the whole tensor the slice belongs to (None: the slice is all that is
    known). Size gates (``SizeAdaptive``: Bi-Sparse, MPQ) decide on it, so every slice of a tensor above
    ``size_lower_bound`` is compressed however small ``slice_elems`` cuts it, as GeoMX gates whole tensors.
    """

    key: int
    slice: int
    kind: TensorKind
    direction: Direction
    tensor_numel: int | None = None

    def gated_numel(self, array: np.ndarray) -> int:
        """The size a size gate compares: the whole tensor's if known, else ``array``'s (the slice)."""
        return int(np.size(array)) if self.tensor_numel is None else self.tensor_numel

    @property
    def state_key(self) -> StateKey:
        return (self.key, self.slice, self.direction)


@dataclass
class Encoded:
    """One encoded tensor slice: ``codec_id`` names the codec that produced ``frames`` and ``meta``.

    ``frames`` are contiguous arrays (each becomes one wire frame; they may reference the encoder's input,
    so keep that unchanged until sent). ``meta`` is small and JSON-safe (e.g. ``{"n": 1000, "k": 10}``).
    """

    codec_id: int
    frames: list[np.ndarray]
    meta: dict[str, MetaValue] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        """Bytes of the frames (what crosses the WAN besides the header and the JSON meta)."""
        return sum(int(frame.nbytes) for frame in self.frames)


class Codec(ABC):
    """A tensor compressor: ``encode`` / ``decode`` / ``estimate_ratio``, built from a JSON spec.

    Subclasses set ``name`` (the spec's "type") and ``codec_id`` (unique on the wire; 0 is DENSE,
    ``COMPOSITE_ID`` for codecs that only delegate). Constructor parameters are the spec's parameters:
    ``Registry.make_codec`` validates them against the constructor's signature and type hints.
    ``size_bound``: True if the spec takes ``size_lower_bound`` (tensors below it travel dense); a worker fills in
    the topology's where the spec names none (``registry.worker_codec``).
    """

    name: ClassVar[str]
    codec_id: ClassVar[int]
    size_bound: ClassVar[bool] = False
    # a codec whose meta is always these non-negative integers (each below 2**32) names them here: its meta then
    # travels as one binary frame of uint32s in this order (``codecs.messages``), not as JSON in the body. Why: at
    # small tensors the JSON (``{"codec_meta":{"n":8192,"chunk":4096,"k":82,"kt":0}}``, 51 bytes) cost more than
    # sparse2bit's payload; as a frame it is 16 bytes.
    meta_fields: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def encode(self, array: np.ndarray, info: TensorInfo) -> Encoded:
        """Encode ``array`` (any shape, a float dtype); raises CodecError for non-finite values."""

    @abstractmethod
    def decode(self, encoded: Encoded, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
        """A new array of ``shape`` and ``dtype`` from a payload; raises CodecError if it is malformed."""

    @abstractmethod
    def estimate_ratio(self, numel: int, dtype: Any) -> float:
        """Expected encoded bytes / dense bytes for a tensor of ``numel`` elements of ``dtype``."""

    def wire_ids(self) -> frozenset[int]:
        """The codec ids this codec's payloads can carry (composites: the union of their parts)."""
        return frozenset({self.codec_id})

    def keeps_residual(self) -> bool:
        """True if the codec carries unsent mass to later rounds itself (so ErrorFeedback must not wrap it)."""
        return False

    def reset(self) -> None:
        """Forget all per-slice state (e.g. after the model was re-initialised). Stateless codecs: nothing."""
        return None

    @classmethod
    def from_spec(cls, params: Mapping[str, object], registry: SpecReader) -> Codec:
        """Build from a spec's parameters (the spec without "type"); override to build a composite."""
        return cls(**registry.constructor_kwargs(cls, params))

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class SliceStates(Generic[S]):
    """A stateful codec's state, one per ``(key, slice, direction)``, refused once the slice changes size.

    Why refuse: a slice whose size changed belongs to a re-initialised key (a new model, another slicing), and state
    carried over from the old one would add stale, misaligned mass; the caller must ``reset()`` the codec instead.
    ``size_of`` reads how many elements a state was made for. Shared by every codec that keeps per-slice state, so
    they all refuse with the same message.
    """

    def __init__(self, size_of: Callable[[S], int]) -> None:
        self._size_of = size_of
        self._states: dict[StateKey, S] = {}

    def get(self, info: TensorInfo, numel: int) -> S | None:
        """The slice's state (None before its first ``put``); CodecError if it was made for another element count."""
        state = self._states.get(info.state_key)
        if state is not None and (size := self._size_of(state)) != numel:
            raise CodecError(f"key {info.key} slice {info.slice} had {size} elements and now has {numel}; "
                             f"call reset() after re-initialising a key")
        return state

    def peek(self, info: TensorInfo) -> S | None:
        """The slice's state without the size check (for readers: tests, diagnostics), or None."""
        return self._states.get(info.state_key)

    def put(self, info: TensorInfo, state: S) -> None:
        self._states[info.state_key] = state

    def clear(self) -> None:
        self._states.clear()


class Residuals(SliceStates[np.ndarray]):
    """Each slice's residual: a flat float32 array of what earlier rounds did not send."""

    def __init__(self) -> None:
        super().__init__(lambda residual: int(residual.size))

    def copy(self, info: TensorInfo) -> np.ndarray | None:
        """A copy of the slice's residual (the caller may keep or change it), or None before its first encode."""
        residual = self.peek(info)
        return None if residual is None else residual.copy()


class ResidualCodec(Codec):
    """A codec that carries what it did not send into the slice's next round, kept in ``_residuals``.

    ``keeps_residual`` is True (so ErrorFeedback refuses to wrap it: unsent mass would be carried twice),
    ``residual(info)`` shows the unsent mass, ``reset`` forgets it. Subclasses call ``super().__init__()``.
    """

    def __init__(self) -> None:
        self._residuals = Residuals()

    def keeps_residual(self) -> bool:
        return True

    def residual(self, info: TensorInfo) -> np.ndarray | None:
        """A copy of the slice's residual (flat float32: what is not sent yet), or None before its first encode."""
        return self._residuals.copy(info)

    def reset(self) -> None:
        self._residuals.clear()


# ---- helpers shared by the codecs: input normalisation and payload validation -------------------------


def float_vector(array: np.ndarray, what: str = "tensor") -> np.ndarray:
    """``array`` flattened, contiguous, as float32 (a view when it already is); refuses non-float dtypes."""
    array = check_float_dtype(array, what)
    return np.ascontiguousarray(array, dtype=np.float32).reshape(-1)


def check_float_dtype(array: np.ndarray, what: str = "tensor") -> np.ndarray:
    """``array`` as an ndarray, if its dtype is float16, float32 or float64 (CodecError otherwise)."""
    array = np.asarray(array)
    if array.dtype not in FLOAT_DTYPES:
        raise CodecError(f"{what} has dtype {array.dtype}; codecs take float16, float32 or float64")
    return array


def check_finite(x: np.ndarray, what: str) -> None:
    """Raise CodecError if ``x`` holds NaN or inf.

    float32/64: min/max propagate NaN, so two fast passes and no temporary. float16: NumPy's min/max
    are ~50x slower there, so test the bits instead — an all-ones exponent (0x7C00) is inf or NaN.
    """
    if not x.size:
        return
    if x.dtype == np.float16:
        if int((x.view(np.uint16) & np.uint16(0x7FFF)).max()) >= 0x7C00:
            raise CodecError(f"{what} contains NaN or inf")
    elif not (math.isfinite(float(x.min())) and math.isfinite(float(x.max()))):
        raise CodecError(f"{what} contains NaN or inf")


def check_kind(info: TensorInfo, codec: str) -> None:
    """Residual-carrying codecs refuse absolute weights: a residual of old weights added to new ones is wrong."""
    if info.kind == "weights":
        raise CodecError(f"{codec} carries residuals across rounds, which only makes sense for additive "
                         f"tensors (gradient or delta); key {info.key} slice {info.slice} is weights — send "
                         f"the delta instead")


def check_id(encoded: Encoded, codec: Codec) -> None:
    if encoded.codec_id != codec.codec_id:
        raise CodecError(f"payload has codec id {encoded.codec_id}; {codec.name} decodes id {codec.codec_id}")


def output_size(shape: tuple[int, ...], dtype: Any) -> tuple[int, np.dtype[Any]]:
    """Validate the target ``shape`` and float ``dtype``; return (numel, dtype) within MAX_DECODE_BYTES."""
    try:
        dtype = np.dtype(dtype)
    except TypeError:
        raise CodecError(f"{dtype!r} is not a dtype") from None
    if dtype not in FLOAT_DTYPES:
        raise CodecError(f"codecs decode to float16, float32 or float64, not {dtype}")
    if not isinstance(shape, tuple) or not all(isinstance(d, (int, np.integer)) and d >= 0 for d in shape):
        raise CodecError(f"shape {shape!r} must be a tuple of non-negative integers")
    if any(d > MAX_DECODE_BYTES for d in shape):
        raise CodecError(f"shape {shape} has a dimension above {MAX_DECODE_BYTES}")
    numel = math.prod(int(d) for d in shape)
    if numel * dtype.itemsize > MAX_DECODE_BYTES:
        raise CodecError(f"shape {shape} of {dtype} needs {numel * dtype.itemsize} bytes, above the decode "
                         f"limit of {MAX_DECODE_BYTES}")
    return numel, dtype


def check_frame_count(encoded: Encoded, expected: int, codec: str) -> None:
    if not isinstance(encoded.frames, (list, tuple)) or len(encoded.frames) != expected:
        count = len(encoded.frames) if isinstance(encoded.frames, (list, tuple)) else type(encoded.frames).__name__
        raise CodecError(f"{codec} payload needs {expected} frames, got {count}")


def frame_as(frame: object, dtype: Any, count: int, what: str) -> np.ndarray:
    """The frame's bytes reinterpreted as ``count`` values of ``dtype`` (a view, no copy).

    Frames from the network are raw bytes whatever dtype the sender's array had, so the expected dtype
    comes from the codec and its meta, and the byte length must match exactly.
    """
    dtype = np.dtype(dtype)
    try:
        if isinstance(frame, np.ndarray):
            if frame.dtype.hasobject or not frame.flags.c_contiguous:
                raise CodecError(f"{what}: frame must be a contiguous array of plain values")
            raw = frame.reshape(-1).view(np.uint8)
        elif isinstance(frame, (bytes, bytearray, memoryview)):
            raw = np.frombuffer(frame, dtype=np.uint8)
        else:
            raise CodecError(f"{what}: frame of type {type(frame).__name__} is not a buffer")
    except (ValueError, TypeError) as exc:
        if isinstance(exc, CodecError):
            raise
        raise CodecError(f"{what}: unreadable frame ({exc})") from None
    expected = count * dtype.itemsize
    if raw.nbytes != expected:
        raise CodecError(f"{what}: frame holds {raw.nbytes} bytes, expected {expected} ({count} x {dtype})")
    return raw.view(dtype)


def meta_int(encoded: Encoded, name: str, low: int, high: int) -> int:
    """An integer meta field within [low, high]; JSON may bring anything, so check the type too."""
    meta = encoded.meta
    if not isinstance(meta, dict) or name not in meta:
        raise CodecError(f"payload meta lacks {name!r}")
    value = meta[name]
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise CodecError(f"payload meta {name}={value!r} is not an integer")
    if not low <= value <= high:
        raise CodecError(f"payload meta {name}={value} is outside [{low}, {high}]")
    return int(value)


def check_meta_n(encoded: Encoded, numel: int) -> None:
    """The payload's element count must be the one the header's shape declares."""
    n = meta_int(encoded, "n", 0, MAX_DECODE_BYTES)
    if n != numel:
        raise CodecError(f"payload meta n={n} does not match the shape's {numel} elements")


def dense_frame(encoded: Encoded, codec: Codec, shape: tuple[int, ...], dtype: Any, frame_dtype: Any,
                what: str) -> tuple[np.ndarray, np.dtype[Any]]:
    """A one-frame dense payload (fp16's, bf16's) checked (its codec, one frame, ``n`` the shape's count): the frame
    as ``frame_dtype`` values (a view) and the dtype to decode into."""
    check_id(encoded, codec)
    numel, out_dtype = output_size(shape, dtype)
    check_frame_count(encoded, 1, codec.name)
    check_meta_n(encoded, numel)
    return frame_as(encoded.frames[0], frame_dtype, numel, what), out_dtype


def saturating_cast(x: np.ndarray, dtype: Any) -> np.ndarray:
    """``x`` as ``dtype`` (a new array), rounding to nearest; values beyond the target's finite range are
    clipped to its largest finite value instead of becoming inf.

    An inf on the wire would poison every party's sum at the server, so out-of-range values saturate
    (float16: ±65504); wrapped in ErrorFeedback, the clipped excess is carried to the next round instead
    of lost. Callers check finiteness first (clipping would turn inf into a finite value silently).
    """
    dtype = np.dtype(dtype)
    if x.dtype.itemsize > dtype.itemsize and x.size:  # narrowing: may leave the target's range
        limit = float(np.finfo(dtype).max)
        if float(x.max()) > limit or float(x.min()) < -limit:
            x = np.clip(x, -limit, limit)
    if x.dtype == np.float32 and dtype == np.float16:  # NumPy's own cast is 20x slower on small values
        return to_half(x)
    if x.dtype == np.float16 and dtype == np.float32:
        return from_half(x)
    return x.astype(dtype)


def to_dtype(values: np.ndarray, dtype: np.dtype[Any], owned: bool) -> np.ndarray:
    """Decoded values in the requested dtype (saturating when narrowing) as an array the caller owns.

    ``owned``: ``values`` is already a fresh array nobody else references, so no copy is needed when the
    dtype matches; otherwise (e.g. a view of a received frame) a copy is made.
    """
    if values.dtype == dtype:
        return values if owned else values.copy()
    return saturating_cast(values, dtype)
