"""The sync policies by kvstore type name: what ``kv.create(name)`` and CONFIGURE's ``sync`` accept.

A new policy is one file in this package and one line here.

Usage::

    policy = sync_policy("dist_async")
    if policy.round_complete(contributors, expected): ...
"""

from __future__ import annotations

from ..core.policy import SyncPolicy
from .fsa import FullySynchronous
from .mixed import Asynchronous
from .ssp import BoundedStaleness

SYNC_POLICIES: dict[str, type[SyncPolicy]] = {cls.name: cls for cls in (
    FullySynchronous,
    Asynchronous,
    BoundedStaleness,
)}


def sync_policy(kind: str) -> SyncPolicy:
    """The policy for a kvstore type string; ValueError lists the valid ones."""
    try:
        return SYNC_POLICIES[kind]()
    except KeyError:
        raise ValueError(f"unknown kvstore type {kind!r}; valid: {sorted(SYNC_POLICIES)}") from None
