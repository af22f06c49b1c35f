"""Plug-in options: the job's ``name -> text`` settings that no part of the config model defines, parsed for
the plug-in that declares them.

The config model collects them (unknown keys of the topology's ``training`` block, ``GEOMX_<NAME>`` variables
nothing else reads); each plug-in class declares what it takes (``options: ClassVar[dict[str, type]]``); the
composition root hands each plug-in its own, parsed here, and refuses any that no plug-in declares.

Usage::

    parse_options("dist_ssp", {"staleness": int}, {"staleness": "2"})     # {"staleness": 2}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..config import ConfigError

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


class OptionError(ConfigError):
    """A plug-in option nobody takes, or a value its plug-in cannot read."""


def parse_value(owner: str, name: str, kind: type, text: str) -> Any:
    """``text`` as ``kind`` (int, float, bool or str); OptionError names the option and its owner."""
    where = f"option {name!r} of {owner}"
    if kind is bool:
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        raise OptionError(f"{where} must be true or false, got {text!r}")
    if kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            raise OptionError(f"{where} must be {'an integer' if kind is int else 'a number'}, got {text!r}") from None
    return text


def parse_options(owner: str, declared: Mapping[str, type], given: Mapping[str, str]) -> dict[str, Any]:
    """The options of ``given`` that ``owner`` declares, parsed (the others are someone else's)."""
    return {name: parse_value(owner, name, kind, given[name]) for name, kind in declared.items() if name in given}


def undeclared(given: Mapping[str, str], takers: Mapping[str, Mapping[str, type]]) -> str | None:
    """The refusal for options of ``given`` that none of ``takers`` (plug-in name -> its options) declares."""
    known = {name for declared in takers.values() for name in declared}
    unknown = sorted(set(given) - known)
    if not unknown:
        return None
    offers = "; ".join(f"{owner} takes {', '.join(f'{n} ({t.__name__})' for n, t in declared.items())}"
                       for owner, declared in sorted(takers.items()) if declared) or "no plug-in takes any"
    return (f"option(s) {unknown} (a training key or GEOMX_<NAME> variable) are taken by no plug-in of this "
            f"job; {offers}")
