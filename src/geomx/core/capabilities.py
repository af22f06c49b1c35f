"""What a server plug-in declares to the rest of the job: one set of flags, declared once for every kind.

A sync policy, an aggregation and a route each say, as class attributes, what the job may rely on; the server
asks all of a server's plug-ins at once (``all_answer_plain_sums``) instead of each interface declaring its own
copy of a flag. ``options`` are the plug-in options a plug-in takes (``geomx.core.options`` parses them).

Usage::

    class MyRoute(Route):
        answers_plain_sums = False       # values travel the route's own way, not in each contributor's reply

    all_answer_plain_sums(policy, aggregation, route)   # what early answers need (geomx.core.early)
"""

from __future__ import annotations

from typing import ClassVar


class Capabilities:
    """The flags every server plug-in declares (the defaults are the plain, direct, summing case)."""

    # Whether every round's answer is the sum of all awaited clients' pushes, released to all of them at once in
    # each contributor's reply: then a global server may send the last party the others' sum ahead of its own
    # push (early answers, geomx.core.early), which needs every plug-in of the server to say so.
    answers_plain_sums: bool = True
    # The options this plug-in takes (name -> int, float, bool or str), parsed from the job's plug-in options
    # by the composition root and handed to its constructor (geomx.core.options).
    options: ClassVar[dict[str, type]] = {}


def all_answer_plain_sums(*plugins: Capabilities) -> bool:
    """Whether every one of a server's ``plugins`` answers plain sums."""
    return all(plugin.answers_plain_sums for plugin in plugins)
