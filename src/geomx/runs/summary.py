"""A job's totals, from its run folder: bytes per link class, per party and per WAN stream, and the last metrics
of every worker (what `geomx launch` prints at the end).

The byte totals have one source: the stats files every process keeps up to date as it runs
(``runlog.StatsFile``), each byte counted once, by its sender. The launcher's summary and ``geomx report`` both
read them through ``traffic``, so they agree to the byte; a job that failed or was stopped reports what its
processes had counted at their last rewrite, and names the processes whose count is not final.

Usage::

    summary = summarize(run_dir, wall_s=42.0)
    summary["wan_bytes_sent_by_party"]          # {"dc0": ..., "dc1": ...}
    traffic(read_stats(run_dir))["wan_bytes"]   # None: no process wrote its counters (unknown, not 0)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .runlog import read_metrics, read_stats


def traffic(stats: list[dict[str, Any]]) -> dict[str, Any]:
    """Bytes sent per link class, per party and per WAN-sending process, from the stats files' entries.

    ``lan_bytes``/``wan_bytes`` are None when no process wrote its counters (unknown, not zero);
    ``not_final``: the processes whose file is a count taken while they ran (they never reached their clean
    exit: killed, or their job stopped), so the totals are at least these.
    """
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
    known = bool(stats)
    return {"lan_bytes": totals["lan"] if known else None, "wan_bytes": totals["wan"] if known else None,
            "wan_bytes_sent_by_party": wan_by_party, "wan_bytes_sent_by_process": wan_by_process,
            "processes_reporting": len(stats),
            # files written before this field existed were written at exit: final
            "not_final": sorted(str(e.get("name", "?")) for e in stats if not e.get("final", True))}


def summarize(run_dir: Path, wall_s: float) -> dict[str, Any]:
    """Totals from the run folder (``traffic``) and every worker's last metrics record."""
    metrics = read_metrics(run_dir)
    last = {name: records[-1] for name, records in metrics.items() if records}
    return {"wall_s": wall_s, **traffic(read_stats(run_dir)), "last_metrics": last}
