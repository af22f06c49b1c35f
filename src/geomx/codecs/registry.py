"""Codec registry: names and wire ids to classes, and JSON specs to configured codec instances.

A spec is ``{"type": name, **params}`` — GeoMX's ``set_gradient_compression({"type": "bsc",
"threshold": 0.01})`` shape. Parameters are validated against the codec constructor's signature and
type hints (int, float, bool, str, or a nested codec spec for ``Codec``-typed parameters); anything
unknown or mistyped raises CodecError listing what is valid. There is no hidden global registry:
``default_registry()`` builds a fresh one holding the built-ins.

Usage::

    registry = default_registry()
    codec = registry.make_codec({"type": "error_feedback", "inner": {"type": "int8", "block": 256}})
    array = registry.decode(payload, shape, np.dtype(np.float32))   # any wire codec, by payload id
"""

from __future__ import annotations

import inspect
import math
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..protocol.wire import MAX_CODEC_ID
from .base import COMPOSITE_ID, Codec, CodecError, Encoded
from .bf16 import BF16
from .bsc import BSC
from .composite import SizeAdaptive
from .dense import Dense
from .error_feedback import ErrorFeedback
from .fp16 import FP16
from .int8 import Int8
from .mpq import MPQ
from .sparse2bit import Sparse2Bit

BUILTINS: tuple[type[Codec], ...] = (Dense, FP16, BSC, Int8, BF16, Sparse2Bit, ErrorFeedback, SizeAdaptive, MPQ)


def check_wire_id(cls: type[Codec]) -> None:
    """CodecError unless ``cls.codec_id`` is one the wire carries (0..MAX_CODEC_ID) or COMPOSITE_ID."""
    codec_id = getattr(cls, "codec_id", None)
    if (isinstance(codec_id, bool) or not isinstance(codec_id, int)
            or not (0 <= codec_id <= MAX_CODEC_ID or codec_id == COMPOSITE_ID)):
        raise CodecError(f"{cls.__qualname__}.codec_id must be in [0, {MAX_CODEC_ID}] (the ids the wire "
                         f"carries: protocol.wire.MAX_CODEC_ID) or COMPOSITE_ID, got {codec_id!r}")


for _builtin in BUILTINS:  # at import: a built-in numbered beyond the wire's range fails here, not mid-job
    check_wire_id(_builtin)


class Registry:
    """Codec classes by name (unique) and by wire id (unique, in the wire's range 0..MAX_CODEC_ID; composites have
    no id of their own)."""

    def __init__(self) -> None:
        self._by_name: dict[str, type[Codec]] = {}
        self._by_id: dict[int, type[Codec]] = {}
        self._decoders: dict[int, Codec] = {}

    def register(self, cls: type[Codec]) -> type[Codec]:
        """Add ``cls``; refuses a taken name or wire id, or an id the wire cannot carry. Returns ``cls``."""
        if not (isinstance(cls, type) and issubclass(cls, Codec)) or inspect.isabstract(cls):
            raise TypeError(f"{cls!r} is not a concrete Codec subclass")
        name, codec_id = getattr(cls, "name", None), getattr(cls, "codec_id", None)
        if not isinstance(name, str) or not name or name != name.lower():
            raise CodecError(f"{cls.__qualname__}.name must be a non-empty lower-case string, got {name!r}")
        check_wire_id(cls)
        if name in self._by_name:
            raise CodecError(f"codec name {name!r} is already registered by {self._by_name[name].__qualname__}")
        if codec_id != COMPOSITE_ID and codec_id in self._by_id:
            raise CodecError(f"codec id {codec_id} (for {cls.__qualname__}) is already taken by "
                             f"{self._by_id[codec_id].__qualname__}")
        self._by_name[name] = cls
        if codec_id != COMPOSITE_ID:
            self._by_id[codec_id] = cls
        return cls

    def names(self) -> list[str]:
        return sorted(self._by_name)

    def codec_class(self, name_or_id: str | int) -> type[Codec]:
        """The class registered under a spec name or a wire id."""
        if isinstance(name_or_id, str):
            cls = self._by_name.get(name_or_id.lower())
            if cls is None:
                raise CodecError(f"unknown codec {name_or_id!r}; known: {self.names()}")
            return cls
        cls = self._by_id.get(int(name_or_id))
        if cls is None:
            raise CodecError(f"unknown codec id {name_or_id}; known: {sorted(self._by_id)}")
        return cls

    def wants_size_bound(self, name: object) -> bool:
        """Whether the codec a spec's "type" names takes ``size_lower_bound`` (its class's ``size_bound``); False
        for a name that is not a registered codec's (``make_codec`` then says what is wrong)."""
        cls = self._by_name.get(name.lower()) if isinstance(name, str) else None
        return cls is not None and cls.size_bound

    def make_codec(self, spec: Mapping[str, object]) -> Codec:
        """A configured codec from ``{"type": name, **params}``; CodecError says what is wrong."""
        if not isinstance(spec, Mapping) or not isinstance(spec.get("type"), str):
            raise CodecError(f"a codec spec is {{'type': name, ...params}} with name one of {self.names()}; "
                             f"got {spec!r}"[:500])
        cls = self.codec_class(str(spec["type"]))
        params = {key: value for key, value in spec.items() if key != "type"}
        try:
            return cls.from_spec(params, self)
        except RecursionError:
            raise CodecError("codec spec is nested too deeply") from None

    def decoder(self, codec_id: int) -> Codec:
        """An instance able to decode payloads of ``codec_id`` (decoding never depends on configuration)."""
        codec = self._decoders.get(codec_id)
        if codec is None:
            codec = self.codec_class(codec_id)()
            self._decoders[codec_id] = codec
        return codec

    def decode(self, encoded: Encoded, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
        """Decode any payload by the codec id it carries — what a receiver does without negotiation."""
        if isinstance(encoded.codec_id, bool) or not isinstance(encoded.codec_id, int):
            raise CodecError(f"payload codec id {encoded.codec_id!r} is not an integer")
        return self.decoder(encoded.codec_id).decode(encoded, shape, dtype)

    def constructor_kwargs(self, cls: type[Codec], params: Mapping[str, object],
                           extra: Mapping[str, type] | None = None, spec_name: str | None = None) -> dict[str, Any]:
        """Spec ``params`` checked against ``cls.__init__`` (plus ``extra`` name → type) as keyword arguments.

        ``spec_name``: the spec type to name in errors, when it is not ``cls.name`` (e.g. "mpq" building a BSC).
        """
        label = spec_name or cls.name
        hints = typing.get_type_hints(cls.__init__)
        parameters = [parameter for name, parameter in inspect.signature(cls.__init__).parameters.items()
                      if name != "self" and parameter.kind in (parameter.POSITIONAL_OR_KEYWORD,
                                                               parameter.KEYWORD_ONLY)]
        accepted: dict[str, Any] = {parameter.name: hints.get(parameter.name, Any) for parameter in parameters}
        accepted.update(extra or {})
        unknown = sorted(set(params) - set(accepted))
        if unknown:
            raise CodecError(f"codec {label!r} has no parameter {', '.join(map(repr, unknown))}; "
                             f"valid: {sorted(accepted)}")
        missing = [p.name for p in parameters if p.default is inspect.Parameter.empty and p.name not in params]
        if missing:
            raise CodecError(f"codec {label!r} needs parameter {', '.join(map(repr, missing))}")
        return {name: self._coerce(label, name, accepted[name], value) for name, value in params.items()}

    def _coerce(self, codec: str, name: str, hint: Any, value: object) -> Any:
        """``value`` as the type ``hint`` names, or CodecError. bool is never accepted as a number."""
        if typing.get_origin(hint) in (typing.Union, types.UnionType):
            options = [arg for arg in typing.get_args(hint) if arg is not type(None)]
            if value is None and len(options) < len(typing.get_args(hint)):
                return None
            if len(options) == 1:
                hint = options[0]
        where = f"codec {codec!r} parameter {name}={value!r}"[:300]
        if hint is bool:
            if isinstance(value, bool):
                return value
            raise CodecError(f"{where} must be true or false")
        if hint is int:
            if isinstance(value, int) and not isinstance(value, bool):
                return value
            raise CodecError(f"{where} must be an integer")
        if hint is float:
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                return float(value)
            raise CodecError(f"{where} must be a finite number")
        if hint is str:
            if isinstance(value, str):
                return value
            raise CodecError(f"{where} must be a string")
        if isinstance(hint, type) and issubclass(hint, Codec):
            # a name alone is its spec without parameters: GEOMX_COMPRESSION=error_feedback:inner=int8
            nested = {"type": value} if isinstance(value, str) else value
            if isinstance(nested, Mapping):
                codec_value = self.make_codec(nested)
                if isinstance(codec_value, hint):
                    return codec_value
            kind = "" if hint is Codec else f"{hint.__name__} "
            raise CodecError(f"{where} must be a {kind}codec: its name ('int8') or a nested spec ({{type: int8}})")
        raise TypeError(f"{codec}.{name} has a type hint codec specs cannot express: {hint!r}")


def default_registry() -> Registry:
    """A fresh registry holding the built-in codecs (dense, fp16, bsc, int8, bf16, sparse2bit, error_feedback,
    size_adaptive, mpq)."""
    registry = Registry()
    for cls in BUILTINS:
        registry.register(cls)
    return registry


def worker_codec(registry: Registry, spec: Mapping[str, object], size_lower_bound: int) -> tuple[dict[str, Any], Codec]:
    """A worker's WAN compression ``spec`` as the servers are sent it, and the codec it builds: a codec that wants a
    size bound (``Codec.size_bound``) and names none gets ``size_lower_bound`` (the topology's). A bad spec raises
    CodecError with the codec's own message.

    Usage: ``spec, codec = worker_codec(registry, {"type": "bsc", "threshold": 0.01}, topology.size_lower_bound)``
    """
    spec = dict(spec)
    if registry.wants_size_bound(spec.get("type")) and "size_lower_bound" not in spec:
        spec["size_lower_bound"] = size_lower_bound
    return spec, registry.make_codec(spec)


def idle_size_gate(spec: Mapping[str, object], size_lower_bound: int, sizes: Sequence[int]) -> str | None:
    """One line when the size gate of a codec that wants a size bound (bsc, mpq) lets none of a model's tensors
    (``sizes``: their elements) through to its compressing side, else None: what the job asked for would silently do
    nothing (GeoMX's default 200000 over the digits CNN, whose largest tensor has 32768). ``size_lower_bound`` is the
    topology's, which a spec without its own gets (``worker_codec``); a spec the registry refuses gives None here.

    Usage: ``idle_size_gate({"type": "bsc"}, 200_000, [144, 32768])`` -> ``"bsc: no tensor reaches ..."``
    """
    try:
        filled, codec = worker_codec(default_registry(), spec, size_lower_bound)
    except CodecError:
        return None
    if not isinstance(codec, SizeAdaptive) or not sizes or codec.reaches(sizes):
        return None
    name, largest = filled["type"], max(sizes)
    what = ("nothing is compressed" if isinstance(codec.small, Dense) else
            f"every tensor travels as {codec.small.name}, none as {codec.large.name}")
    whose = ("the compression spec's size_lower_bound" if "size_lower_bound" in spec else
             "the topology's size_lower_bound (or GEOMX_SIZE_LOWER_BOUND)")
    return (f"{name}: no tensor reaches size_lower_bound={codec.bound} (largest: {largest} elements); {what}: lower "
            f"{whose} to at most {largest}")


def make_codec(spec: Mapping[str, object]) -> Codec:
    """``default_registry().make_codec(spec)``, for callers that need no custom codecs."""
    return default_registry().make_codec(spec)
