"""What the kvstore API checks of its arguments before it sends anything.

Each check names the call and what is wrong: a key never declared (``UnknownKeyError``, a ``KeyError`` whose text
reads as written: a bare KeyError quotes its message), key and tensor lists of different lengths (``paired``:
``zip`` would name neither list, or cut the longer one short after the first pushes were sent).

Usage::

    keys = KnownKeys(planner, servers)                    # a KeyTable whose unknown keys say to init them
    pairs = paired("push", key, value, "values")          # [(k, v), ...] or ValueError("push got 3 keys but ...")
    for k, v, info in checked(keys, "push", key, value, "values"): ...   # and each key known, of init's shape
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .slices import KeyInfo, KeyTable

KNOWN_SHOWN = 20  # the known keys an UnknownKeyError lists at most


class UnknownKeyError(KeyError):
    """A key the worker never ``init``-ed. A ``KeyError`` (callers that catch one still do), whose ``str`` is
    the message itself: a bare KeyError's is its ``repr``, quotes and all."""

    def __init__(self, key: int, known: Sequence[int]) -> None:
        shown = ", ".join(map(str, sorted(known)[:KNOWN_SHOWN])) + (", ..." if len(known) > KNOWN_SHOWN else "")
        known_text = f"known keys: {shown}" if known else "no key is initialized yet"
        super().__init__(f"key {key} was never initialized: call kv.init({key}, tensor) before pushing or pulling "
                         f"it ({known_text})")
        self.key = key

    def __str__(self) -> str:
        return str(self.args[0])


class KnownKeys(KeyTable):
    """The kvstore's key table: a key it was never told of raises ``UnknownKeyError``."""

    def info(self, key: int) -> KeyInfo:
        if not self.closed and isinstance(key, int) and not isinstance(key, bool) and key not in self:
            raise UnknownKeyError(key, list(self))
        return super().info(key)


def _as_list(value: Any) -> list[Any]:
    """A key or tensor argument as a list: MXNet's calls take one, or a list (or tuple) of them."""
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _count(number: int, noun: str) -> str:
    return f"{number} {noun if number != 1 else noun.removesuffix('s')}"


def paired(what: str, key: Any, value: Any, noun: str = "values") -> list[tuple[Any, Any]]:
    """``key`` and ``value`` (each one, or a list) as pairs; a ValueError naming ``what`` and both counts where
    their lengths differ, before anything is sent."""
    keys, values = _as_list(key), _as_list(value)
    if len(keys) != len(values):
        raise ValueError(f"{what} got {_count(len(keys), 'keys')} but {_count(len(values), noun)}: pass one "
                         f"tensor per key")
    return list(zip(keys, values, strict=True))


def checked(keys: KeyTable, what: str, key: Any, tensor: Any, noun: str) -> list[tuple[int, torch.Tensor, KeyInfo]]:
    """``key`` and ``tensor`` paired (``what``: the call; ``noun``: ``values`` to push or ``outputs`` to pull into),
    each key known and each tensor of its key's shape, with the key's slices: all checked before the caller sends
    or waits for anything (a bad third key must not leave two pushes half a call behind)."""
    use = "push" if noun == "values" else "pull"
    return [(k, t, keys.check(k, t, use)) for k, t in paired(what, key, tensor, noun)]

