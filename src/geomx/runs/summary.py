"""A finished job's totals, from its run folder: bytes per link class, per party and per WAN stream, and the last
metrics of every worker (what `geomx launch` prints at the end).

Usage::

    summary = summarize(run_dir, wall_s=42.0)
    summary["wan_bytes_sent_by_party"]          # {"dc0": ..., "dc1": ...}
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .runlog import read_metrics, read_stats


def summarize(run_dir: Path, wall_s: float) -> dict[str, Any]:
    """Totals from the run folder: bytes sent per link class (each byte counted once, by its sender)."""
    stats = read_stats(run_dir)
    totals = {"lan": 0, "wan": 0}
    wan_by_party: dict[str, int] = {}
    wan_by_process: dict[str, int] = {}  # every process that sent over the WAN: a collective party's ranks each do
    for entry in stats:
        for link in ("lan", "wan"):
            totals[link] += int(entry.get(link, {}).get("sent", 0))
        party = str(entry.get("party", "?"))
        sent = int(entry.get("wan", {}).get("sent", 0))
        wan_by_party[party] = wan_by_party.get(party, 0) + sent
        if sent:
            wan_by_process[str(entry.get("name", party))] = sent
    metrics = read_metrics(run_dir)
    last = {name: records[-1] for name, records in metrics.items() if records}
    return {"wall_s": wall_s, "lan_bytes": totals["lan"], "wan_bytes": totals["wan"],
            "wan_bytes_sent_by_party": wan_by_party, "wan_bytes_sent_by_process": wan_by_process,
            "processes_reporting": len(stats), "last_metrics": last}
