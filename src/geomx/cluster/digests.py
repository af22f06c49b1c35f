"""Whether the parties hold the same model: the workers' model digests, compared step by step.

Where the algorithm gives every party the same model after a global round (FSA), each worker digests its model
now and then, at steps every party digests alike (``geomx.torch.digest``), and its heartbeats carry the last few
(``HeartbeatBody.models``: step -> hex digest), relayed by its party's scheduler and local server up to the global
scheduler. Its ``StatusBoard`` hands them to a ``DigestBook``, which keeps every member's digests of the last
``KEEP_STEPS`` steps heard, compares those of one step across members and, when they differ, counts the step and
logs a warning naming the parties (the members, where one party's differ among themselves) and their digests:
once per set of disagreeing groups, so that a model that went apart for good is named once, not at every step.

Usage::

    book = DigestBook("global_scheduler")
    book.add("dc1", "dc1/worker0", {"40": "5f1c..."})     # on every report that carries digests
    book.summary()      # {"step": 40, "parties": {"dc0": ["5f1c..."], "dc1": ["5f1c..."]}, "agree": True, ...}
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("geomx.cluster.status")

KEEP_STEPS = 64  # steps whose digests the book keeps (a party's report may trail another's by a few)
SHOWN = 12  # hex digits of a digest in a log line


def _names(labels: list[str]) -> str:
    return labels[0] if len(labels) == 1 else f"{', '.join(labels[:-1])} and {labels[-1]}"


class DigestBook:
    """The members' model digests by step, compared (not thread-safe: the ``StatusBoard`` holds its lock)."""

    def __init__(self, owner: str) -> None:
        self._owner = owner
        self._steps: dict[int, dict[tuple[str, str], str]] = {}  # step -> (party, member) -> digest
        self._latest: dict[tuple[str, str], tuple[int, str]] = {}  # (party, member) -> its newest (step, digest)
        self._disagreed: dict[int, dict[str, str]] = {}  # steps that disagreed -> {group's label: digest}
        self._warned: set[frozenset[str]] = set()
        self.disagreements = 0  # steps at which the members' digests differed, since the scheduler started

    def add(self, party: str, member: str, models: dict[str, Any] | None) -> None:
        """``member`` of ``party`` reported ``models`` (step -> digest; anything else in it is ignored)."""
        for key, digest in (models or {}).items():
            if not isinstance(key, str) or not key.isdigit() or not isinstance(digest, str):
                continue
            step = int(key)
            if len(self._steps) >= KEEP_STEPS and step < min(self._steps):
                continue  # older than anything kept: nobody's is left to compare it with
            entry = self._steps.setdefault(step, {})
            if entry.get((party, member)) == digest:
                continue
            entry[(party, member)] = digest
            latest = self._latest.get((party, member))
            if latest is None or step >= latest[0]:
                self._latest[(party, member)] = (step, digest)
            self._judge(step, entry)
        while len(self._steps) > KEEP_STEPS:
            oldest = min(self._steps)
            del self._steps[oldest]
            self._disagreed.pop(oldest, None)

    def forget(self, party: str) -> None:
        """Drop ``party``'s digests (a party restarted into the job: its steps are no longer the job's), so that
        the summary compares the others at their newest step. Disagreements already counted stay counted."""
        for entry in self._steps.values():
            for who in [who for who in entry if who[0] == party]:
                del entry[who]
        self._latest = {who: found for who, found in self._latest.items() if who[0] != party}

    def latest(self, party: str, member: str) -> dict[str, Any] | None:
        """``member``'s newest digest: ``{"step", "digest"}``, or None where it reported none."""
        found = self._latest.get((party, member))
        return None if found is None else {"step": found[0], "digest": found[1]}

    def _judge(self, step: int, entry: dict[tuple[str, str], str]) -> None:
        """Count and name a disagreement at ``step`` the first time its members' digests differ."""
        groups: dict[str, list[tuple[str, str]]] = {}
        for who, digest in entry.items():
            groups.setdefault(digest, []).append(who)
        if len(groups) < 2 or step in self._disagreed:
            return
        self.disagreements += 1
        split = len({party for party, _ in entry}) < sum(len({p for p, _ in g}) for g in groups.values())
        labels = {digest: ", ".join(sorted({member if split else party for party, member in group}))
                  for digest, group in groups.items()}
        self._disagreed[step] = {labels[d]: d for d in sorted(groups, key=lambda d: labels[d])}
        key = frozenset(labels.values())
        if key in self._warned:
            return
        self._warned.add(key)
        named = sorted(labels.values())
        shown = " vs ".join(f"{d[:SHOWN]}.. ({label})" for label, d in self._disagreed[step].items())
        log.warning("[%s] %s %s disagree on the model at step %d: digests %s", self._owner,
                    "members" if split else "parties", _names(named), step, shown)

    def summary(self) -> dict[str, Any]:
        """For ``/status.json``: the newest step that every party reporting digests reported (else the newest
        that two members did), each party's digests at it and whether they agree; the disagreements counted
        and the newest one."""
        parties = {party for party, _ in self._latest}
        full = [s for s, e in self._steps.items() if {p for p, _ in e} == parties and len(e) > 1]
        step = max(full, default=max((s for s, e in self._steps.items() if len(e) > 1), default=None))
        at: dict[str, list[str]] = {}
        for (party, _), digest in sorted(self._steps.get(step, {}).items()) if step is not None else ():
            if digest not in at.setdefault(party, []):
                at[party].append(digest)
        last = max(self._disagreed, default=None)
        return {"step": step, "parties": at, "agree": None if step is None else
                len({d for ds in at.values() for d in ds}) == 1, "disagreements": self.disagreements,
                "last_disagreement": None if last is None else {"step": last, "digests": self._disagreed[last]}}
