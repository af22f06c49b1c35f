"""Who stopped the job: what servers find out about their clients, kept in the run folder for the summary.

When a process stops sending (it hangs in its own code, or it left the job while the others wait for its part of
a round), the first process to exit is one of the others: a healthy worker whose own wait ran out. The launcher
would name it. The servers know better: a round that timed out names the clients it waited for, and a client
that shut down while a round still needs it names itself. Servers append such findings to
``RUN/findings/<name>.jsonl`` as they happen (``record_finding``); the launcher's summary reads them
(``read_findings``) and names the culprit (``culprit``): a client some server waited for that was not itself
waiting for anyone (a local server that timed out waiting for a worker is a victim, as is the global server
waiting for that local server).

Usage::

    record_finding(run_dir, "dc0/server", {"what": MISSING, "kind": "PUSHPULL", "round": 3,
                                           "clients": ["dc0/worker1"], "waited_s": 20.0})
    culprit(read_findings(run_dir), first_failed="dc0/worker0", exit_codes={"dc0/worker0": 1})
    # -> ("dc0/worker1", "dc0/worker1 sent nothing for round 3 in 20 s")
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .runlog import file_name

FOLDER = "findings"
MISSING = "missing"  # a round timed out waiting for ``clients``: they sent nothing for it
LEFT = "left"  # ``clients`` shut down while a round still needed their part of it
UNREGISTERED = "unregistered"  # a scheduler's registration timed out: ``clients`` (role@party) never registered
LOST = "lost"  # a scheduler exited with ``clients`` declared dead (no heartbeat), not replaced: ``why``: their causes
COLLECTIVE = "/ranks"  # the client name of a collective party's ranks ends so (``geomx.core.clients``)


def record_finding(run_dir: Path | None, name: str, finding: dict[str, Any]) -> None:
    """Append one finding of process ``name`` (with the time) to the run folder; a ``run_dir`` of None writes
    nothing. Why append at once: the process may be stopped a moment later, with the rest of the job."""
    if run_dir is None:
        return
    folder = run_dir / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{file_name(name)}.jsonl", "a") as handle:
        handle.write(json.dumps({"time": time.time(), "by": name, **finding}) + "\n")


def read_findings(run_dir: Path, since: float | None = None) -> list[dict[str, Any]]:
    """Every process's findings, oldest first; ``since`` (a ``time.time()``): only those made since (a resumed
    job's run folder holds the interrupted run's too)."""
    folder = run_dir / FOLDER
    if not folder.is_dir():
        return []
    found: list[dict[str, Any]] = []
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                entry = json.loads(line)
            except ValueError:  # a line cut short by a process stopped mid-write
                continue
            if isinstance(entry, dict) and (since is None or entry.get("time", since) >= since):
                found.append(entry)
    return sorted(found, key=lambda entry: float(entry.get("time", 0.0)))


def _part(kind: str, number: Any) -> str:
    return f"its push of round {number}" if kind == "PUSHPULL" else f"its {kind} of round {number}"


def describe(client: str, finding: Mapping[str, Any], exit_code: int | None) -> str:
    """One finding about ``client`` in words, with its exit code where it exited by itself. A ``lan: collective``
    party's ranks are one client of the global servers (``<party>/ranks``): the party is named, not a rank."""
    kind, number = str(finding.get("kind", "PUSHPULL")), finding.get("round", "?")
    if finding.get("what") == UNREGISTERED:  # (every member missing, in one line)
        return (f"{', '.join(map(str, finding.get('clients', [])))} never registered with {finding.get('by')} in "
                f"{float(finding.get('waited_s', 0.0)):g} s: is every party started, with its address?")
    if finding.get("what") == LOST:  # (the job's goodbyes could not complete: a party gone under MixedSync ...)
        return f"{client} was lost: {finding.get('why', {}).get(client, 'declared dead')}"
    if client.endswith(COLLECTIVE):
        client = f"{client[:-len(COLLECTIVE)]} (a lan: collective party)"
    if finding.get("what") == LEFT:
        how = f"exited with code {exit_code}" if exit_code is not None and exit_code >= 0 else "left the job"
        return f"{client} {how} before {_part(kind, number)}, which the others waited for"
    return f"{client} sent nothing for round {number} in {float(finding.get('waited_s', 0.0)):g} s"


def culprit(findings: list[dict[str, Any]], first_failed: str | None,
            exit_codes: Mapping[str, int | None]) -> tuple[str | None, str | None]:
    """The process that stopped the job, and why in words: the first client a finding names that was not
    waiting for anyone itself (no finding of its own); else ``first_failed`` (the first process that exited
    non-zero), without words. A culprit that is no process of ``exit_codes`` (a collective party, another
    launcher's process) is named in the words alone."""
    waiters = {str(f.get("by")) for f in findings}
    for finding in findings:
        for client in map(str, finding.get("clients", [])):
            if client not in waiters:
                words = describe(client, finding, exit_codes.get(client))
                return (client if client in exit_codes else first_failed), words
    return first_failed, None
