"""Message kinds: the core's (``Kind``) and the numbers an algorithm may give kinds of its own (``PluginKind``).

The header carries a kind as one byte. ``Kind`` holds the core's (registration, pushes, pulls, bundles of pushes,
...); an algorithm declares its own in its folder's ``kinds.py`` as a ``PluginKind`` numbered in ``PLUGIN_KINDS``,
so the wire needs no change per algorithm. ``geomx.protocol.wire`` encodes and checks them.

Usage::

    from geomx.protocol.kinds import Kind, PluginKind
    MINE = PluginKind(40, "myalgo.mine")               # in an algorithm's folder: geomx.algorithms.myalgo.kinds
    assert PluginKind(40) == MINE                      # ==, never ``is``: decoded, it is a new int
"""

from __future__ import annotations

import enum
import operator
from collections.abc import Iterable
from typing import TypeAlias


class Kind(enum.IntEnum):
    """What a message asks for (or answers, with ``Flag.REPLY``)."""

    REGISTER = 1  # node -> scheduler: who I am, where I listen; reply: the address book
    INIT = 2  # client -> server: declare a key (the master's copy carries the initial value)
    PUSHPULL = 3  # client -> server: contribute to this round; reply: the round's result
    PULL = 4  # client -> server: the current value
    CONFIGURE = 5  # master worker -> servers: JSON {"optimizer": spec, "sync": name}
    BARRIER = 6  # client -> server: a round without data
    STATS = 7  # anyone -> node: its byte counters (JSON)
    SHUTDOWN = 8  # client -> server / node -> scheduler: I am done
    ERROR = 9  # reply carrying {"error": "..."} in the body
    HEARTBEAT = 10  # reserved for failure detection
    MEMBERS = 11  # global scheduler -> global servers: a restarted party's local server replaces its dead one
    BUNDLE = 12  # client -> server: several PUSHPULLs to one server as one message; reply: their answers, as one


# The header numbers an algorithm may give its own message kinds (``PluginKind``). Below them: ``Kind``'s, the
# core's (the numbers it does not use yet are kept free for it to grow; 0 is never a kind).
PLUGIN_KINDS = range(32, 256)


class PluginKind(int):
    """A message kind that an algorithm declares for itself, so that the wire needs no change per algorithm.

    An int in ``PLUGIN_KINDS`` with a ``name`` for logs and traces. It compares and hashes as its number: a
    received message's kind (decoded without a name, since the wire knows no algorithm) equals the declared
    one and finds its handler in a dict keyed by it. Compare kinds with ``==`` or look them up; never with
    ``is``. Two algorithms must not declare the same number: ``check_plugin_kinds`` refuses that (the
    algorithms' registry lists every declared kind).

    Usage::

        OVERLAY = PluginKind(40, "myalgo.overlay")
        handlers = {OVERLAY: on_overlay}
        handlers[decode(frames).kind]          # a received OVERLAY (an unnamed PluginKind(40)) finds on_overlay
    """

    _name: str

    def __new__(cls, value: int, name: str | None = None) -> PluginKind:
        if isinstance(value, bool):
            raise ValueError(f"a plugin message kind is a number in {_span(PLUGIN_KINDS)}, not {value!r}")
        number = operator.index(value)
        if number not in PLUGIN_KINDS:
            raise ValueError(f"plugin message kind {number} ({name or 'unnamed'}) is outside {_span(PLUGIN_KINDS)}, "
                             f"the numbers reserved for algorithms' kinds (1..{max(Kind)} are the core's Kind)")
        self = super().__new__(cls, number)
        self._name = name if name else f"kind {number}"
        return self

    @property
    def name(self) -> str:
        """The declared name (``"myalgo.overlay"``), or ``"kind N"`` for one decoded from the wire."""
        return self._name

    def __repr__(self) -> str:
        return f"PluginKind({int(self)}, {self._name!r})"

    def __str__(self) -> str:
        return str(int(self))  # as IntEnum's: the number (f-strings and %s included)

    def __getnewargs__(self) -> tuple[int, str]:  # type: ignore[override]
        return int(self), self._name


# What ``Message.kind`` holds: a core kind, or an algorithm's.
MessageKind: TypeAlias = Kind | PluginKind


def _span(numbers: range) -> str:
    return f"{numbers.start}..{numbers.stop - 1}"


def check_plugin_kinds(kinds: Iterable[PluginKind]) -> None:
    """ValueError naming both when two declared kinds share a number: on the wire they would be one kind, and
    the second algorithm's handler would take the first one's messages.

    Usage::

        check_plugin_kinds([PluginKind(40, "a.one"), PluginKind(41, "b.one")])   # fine
        check_plugin_kinds([PluginKind(40, "a.one"), PluginKind(40, "b.one")])   # ValueError: both 40
    """
    seen: dict[int, PluginKind] = {}
    for kind in kinds:
        if not isinstance(kind, PluginKind):
            raise ValueError(f"{kind!r} is not a PluginKind")
        other = seen.setdefault(int(kind), kind)
        if other is not kind and other.name != kind.name:
            raise ValueError(f"message kinds {other.name!r} and {kind.name!r} share the number {int(kind)}; "
                             f"give one of them another number in {_span(PLUGIN_KINDS)}")
