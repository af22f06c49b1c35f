"""A bundle part's header, compact: the fixed header's fields as five bytes and LEB128 varints.

A message's own header is fixed-size (``wire._HEADER``: 44 bytes and 8 per dimension), which is nothing beside a
tensor of millions of elements, but was the largest cost of a compressed round of a small model: 87.7K parameters
in 30 tensors went up as 30 parts of one bundle per rank, each part with its 52-byte header beside a sparse2bit
payload of 108 bytes on average (0.018 of the 0.073 bytes per parameter a party sent per outer step). Inside a
bundle the magic and version are the bundle's, and the numbers are small: kind, flags, codec, dtype and ndim take a
byte each, then priority and key (zigzag, they are signed), slice, num_slices, request id, round and each
dimension as varints: 13-16 bytes for a part of a model's round.

``compact`` takes the fields as ``wire._HEADER`` unpacks them (without magic and version) and the dimensions;
``expand`` gives them back, refusing a truncated or overlong varint, a value beyond its field's range, or trailing
bytes, each by name, with ``WireError``; ``wire.decode`` then checks the expanded header as any other.

Usage (by ``geomx.protocol.wire``'s bundles)::

    short = compact(fields, dims)            # fields: kind, flags, codec, dtype, ndim, priority, key, slice, ...
    fields, dims = expand(short)
"""

from __future__ import annotations

from collections.abc import Sequence

# the fields after magic and version, as wire._HEADER holds them: name, (lowest, highest), zigzag-coded
BYTE_FIELDS = ("kind", "flags", "codec", "dtype", "ndim")
VARINT_FIELDS: tuple[tuple[str, int, int, bool], ...] = (
    ("priority", -(1 << 31), (1 << 31) - 1, True),
    ("key", -(1 << 63), (1 << 63) - 1, True),
    ("slice", 0, (1 << 32) - 1, False),
    ("num_slices", 0, (1 << 32) - 1, False),
    ("request_id", 0, (1 << 64) - 1, False),
    ("round", 0, (1 << 64) - 1, False),
)
MAX_VARINT_BYTES = 10  # 64 bits in 7-bit groups


class CompactError(ValueError):
    """A compact header that does not expand (``wire`` raises it again as a ``WireError``)."""


def _zigzag(value: int) -> int:
    return value * 2 if value >= 0 else -value * 2 - 1


def _unzigzag(value: int) -> int:
    return value // 2 if value % 2 == 0 else -(value + 1) // 2


def _varint(value: int, out: bytearray) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def compact(fields: Sequence[int], dims: Sequence[int]) -> bytes:
    """The compact header of a message whose fixed header holds ``fields`` (kind .. round) and ``dims``."""
    out = bytearray(fields[:len(BYTE_FIELDS)])
    for value, (_, _, _, signed) in zip(fields[len(BYTE_FIELDS):], VARINT_FIELDS, strict=True):
        _varint(_zigzag(value) if signed else value, out)
    for dim in dims:
        _varint(dim, out)
    return bytes(out)


def _read_varint(buffer: bytes, at: int, name: str) -> tuple[int, int]:
    value = shift = 0
    for used in range(MAX_VARINT_BYTES):
        if at + used >= len(buffer):
            raise CompactError(f"compact header: {name} is cut off")
        byte = buffer[at + used]
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            if value >= 1 << 64:
                raise CompactError(f"compact header: {name} is beyond 64 bits")
            return value, at + used + 1
    raise CompactError(f"compact header: {name} runs past {MAX_VARINT_BYTES} bytes")


def expand(buffer: bytes) -> tuple[list[int], list[int]]:
    """(fields, dims) of a compact header; CompactError naming what is wrong."""
    count = len(BYTE_FIELDS)
    if len(buffer) < count:
        raise CompactError(f"compact header of {len(buffer)} bytes is shorter than its {count} fixed bytes")
    fields = list(buffer[:count])
    at = count
    for name, low, high, signed in VARINT_FIELDS:
        raw, at = _read_varint(buffer, at, name)
        value = _unzigzag(raw) if signed else raw
        if not low <= value <= high:
            raise CompactError(f"compact header: {name} {value} is outside [{low}, {high}]")
        fields.append(value)
    dims = []
    for index in range(fields[BYTE_FIELDS.index("ndim")]):
        dim, at = _read_varint(buffer, at, f"dimension {index}")
        dims.append(dim)
    if at != len(buffer):
        raise CompactError(f"compact header: {len(buffer) - at} bytes after its last field")
    return fields, dims
