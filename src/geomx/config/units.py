"""Bandwidths and durations as people write them in topology files and environment variables.

Usage::

    parse_bandwidth("100Mbit")   # 1e8 (bit/s)
    parse_duration("25ms")       # 0.025 (s); "2m" is 120.0, "1h" 3600.0
"""

from __future__ import annotations

import re

from .errors import ConfigError

_UNITS = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


def parse_number(text: str, what: str, hint: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"cannot read {what} {text!r}; write it like {hint}") from None


def parse_bandwidth(text: str | float | None) -> float | None:
    """'100Mbit' / '10 Gbit/s' / '1e8' (bits per second) / '12MB' (bytes) / None or 'unlimited' -> bit/s.

    A lower-case ``b`` (or ``bit``, ``bps``) means bits, an upper-case ``B`` (or ``byte``) bytes.
    """
    if text is None:
        return None
    if isinstance(text, (int, float)):
        if text <= 0:
            raise ConfigError(f"bandwidth must be positive, got {text}")
        return float(text)
    cleaned = text.strip().replace(" ", "")
    if cleaned.lower() in ("", "none", "unlimited", "inf"):
        return None
    hint = "'100Mbit' or '10Gbit'"
    match = re.fullmatch(r"([0-9.eE+-]+)([kKmMgGtT]?)(bit|bps|b|B|Bps|byte|bytes)?(/s)?", cleaned)
    if not match:
        raise ConfigError(f"cannot read bandwidth {text!r}; write it like {hint}")
    value = parse_number(match.group(1), "bandwidth", hint) * _UNITS[match.group(2).lower()]
    if match.group(3) in ("B", "Bps", "byte", "bytes"):
        value *= 8
    if value <= 0:
        raise ConfigError(f"bandwidth must be positive, got {text!r}")
    return value


# a duration's units, in seconds: a timeout of minutes (`request: 2m`) is as common as a latency of milliseconds
_DURATION_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def parse_duration(text: str | float | None) -> float:
    """'25ms' / '0.5s' / '100us' / '2m' (or '2min') / '1h' / 0.025 -> seconds (a bare number is seconds)."""
    if text is None:
        return 0.0
    if isinstance(text, (int, float)):
        if text < 0:
            raise ConfigError(f"duration must not be negative, got {text}")
        return float(text)
    hint = "'25ms', '1.5s' or '2m' (units us, ms, s, m, h)"
    match = re.fullmatch(r"\s*([0-9.e+-]+)\s*(us|ms|s|min|m|h|)\s*", text.lower())
    if not match:
        raise ConfigError(f"cannot read duration {text!r}; write it like {hint}")
    scale = _DURATION_UNITS[match.group(2)]
    value = parse_number(match.group(1), "duration", hint) * scale
    if value < 0:
        raise ConfigError(f"duration must not be negative, got {text!r}")
    return value

