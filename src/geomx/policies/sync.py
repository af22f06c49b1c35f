"""Synchronization policies: when a server round is complete.

The server core runs rounds (collect, reduce, release); a policy decides when a round may be released.
Only FSA exists yet: every expected client must contribute. MixedSync, HFA and ESync will be one class
each behind the same interface.

Usage::

    policy = sync_policy("dist_sync")
    if policy.round_complete(contributors, expected): ...
"""

from __future__ import annotations

from collections.abc import Collection


class SyncPolicy:
    """Decides when the contributions collected so far make a complete round."""

    name = ""

    def round_complete(self, contributors: Collection[str], expected: Collection[str]) -> bool:
        raise NotImplementedError


class FullySynchronous(SyncPolicy):
    """FSA: a round completes when every expected client has contributed."""

    name = "dist_sync"

    def round_complete(self, contributors: Collection[str], expected: Collection[str]) -> bool:
        return set(expected) <= set(contributors)


SYNC_POLICIES: dict[str, type[SyncPolicy]] = {cls.name: cls for cls in (FullySynchronous,)}


def sync_policy(kind: str) -> SyncPolicy:
    """The policy for a kvstore type string; ValueError lists the valid ones."""
    try:
        return SYNC_POLICIES[kind]()
    except KeyError:
        raise ValueError(f"unknown kvstore type {kind!r}; valid: {sorted(SYNC_POLICIES)}") from None
