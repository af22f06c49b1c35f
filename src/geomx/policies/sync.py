"""Synchronization policies: when a server round is complete.

The server core runs rounds (collect, reduce, release); a policy decides when a round of pushes may be
released. FSA (``dist_sync``) waits for every client. MixedSync (``dist_async``) releases every push on
arrival at the global servers, while local servers stay synchronous. Each algorithm is one class here.

Usage::

    policy = sync_policy("dist_async")
    if policy.round_complete(contributors, expected): ...
"""

from __future__ import annotations

from collections.abc import Collection

from ..core.policy import SyncPolicy

__all__ = ["SYNC_POLICIES", "Asynchronous", "FullySynchronous", "SyncPolicy", "sync_policy"]


class FullySynchronous(SyncPolicy):
    """FSA: a round completes when every expected client has contributed."""

    name = "dist_sync"

    def round_complete(self, contributors: Collection[str], expected: Collection[str]) -> bool:
        return set(expected) <= set(contributors)


class Asynchronous(SyncPolicy):
    """MixedSync's global tier: every push is its own round, applied and answered on arrival."""

    name = "dist_async"
    clients_leave_independently = True

    def round_complete(self, contributors: Collection[str], expected: Collection[str]) -> bool:
        return len(contributors) >= 1


SYNC_POLICIES: dict[str, type[SyncPolicy]] = {cls.name: cls for cls in (FullySynchronous, Asynchronous)}


def sync_policy(kind: str) -> SyncPolicy:
    """The policy for a kvstore type string; ValueError lists the valid ones."""
    try:
        return SYNC_POLICIES[kind]()
    except KeyError:
        raise ValueError(f"unknown kvstore type {kind!r}; valid: {sorted(SYNC_POLICIES)}") from None
