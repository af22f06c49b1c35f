"""A run's totals, from its run folder: bytes per link class, per party and per WAN stream, and the last metrics
of every worker (what `geomx launch` prints at the end). A resumed job's run (``--resume``) shares the folder
with the runs before it; its summary counts only what was written since it started (``summarize``'s ``since``),
while ``geomx report`` covers the whole job (``runs.report``). Likewise the launchers of one job's parties
(``geomx launch --party``) may share a run folder: each one's summary counts only the processes it started
(``summarize``'s ``processes``), ``geomx report`` every process.

The byte totals have one source: the stats files every process keeps up to date as it runs
(``runlog.StatsFile``), each byte counted once, by its sender. The launcher's summary and ``geomx report`` both
read them through ``traffic``, so they agree to the byte; a job that failed or was stopped reports what its
processes had counted at their last rewrite, and names the processes whose count is not final.

Usage::

    summary = summarize(run_dir, wall_s=42.0, since=started)   # started: the run's time.time() at its start
    summarize(run_dir, 42.0, since=started, processes=["dc1/server", "dc1/worker0"])  # one launcher's processes
    summary["wan_bytes_sent_by_party"]          # {"dc0": ..., "dc1": ...}
    traffic(read_stats(run_dir))["wan_bytes"]   # None: no process wrote its counters (unknown, not 0)
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .findings import culprit, read_findings
from .runlog import file_name, read_metrics, read_stats


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
        if sent:  # (a process restarted under the same name adds to its predecessor's)
            name = str(entry.get("name", party))
            wan_by_process[name] = wan_by_process.get(name, 0) + sent
    known = bool(stats)
    return {"lan_bytes": totals["lan"] if known else None, "wan_bytes": totals["wan"] if known else None,
            "wan_bytes_sent_by_party": wan_by_party, "wan_bytes_sent_by_process": wan_by_process,
            "processes_reporting": len(stats),
            # files written before this field existed were written at exit: final
            "not_final": sorted(str(e.get("name", "?")) for e in stats if not e.get("final", True))}


def summarize(run_dir: Path, wall_s: float, since: float | None = None,
              processes: Iterable[str] | None = None) -> dict[str, Any]:
    """Totals from the run folder (``traffic``) and every worker's last metrics record.

    ``since``: the ``time.time()`` this run started at; only the stats files and metrics records written since
    count. Why: a resumed job (``--resume``) runs in the interrupted one's folder, whose files would otherwise be
    added to this run's (and an interrupted run's counts, not final, named as this run's). ``earlier_runs``: the
    folder also holds counts or records from before ``since`` (``geomx report`` covers the whole job).

    ``processes``: the names of the processes this launcher started (``dc1/worker0``, ``global_server0``: its
    labels; a mapping's keys do, e.g. ``Launcher.pids()``); only theirs count. Why: one launcher per party
    (``--party``) may share the folder with the other parties' launchers, whose processes run at the same time:
    their bytes are not this launcher's, nor are they stopped before a clean exit when this one ends.
    ``other_processes``: the names left out for it (none when ``processes`` is None: every process counts)."""
    mine = None if processes is None else set(processes)
    stems = None if mine is None else {file_name(name) for name in mine}  # metrics files are named by stem

    def own_stats(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [e for e in entries if mine is None or str(e.get("name", "?")) in mine]

    def own_metrics(by_stem: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
        return {stem: records for stem, records in by_stem.items() if stems is None or stem in stems}

    all_stats, all_metrics = read_stats(run_dir, since), read_metrics(run_dir, since)
    stats, metrics = own_stats(all_stats), own_metrics(all_metrics)
    others = {str(e.get("name", "?")) for e in all_stats} - {str(e.get("name", "?")) for e in stats}
    others |= {stem for stem, records in all_metrics.items()  # (a worker without a stats file of its own)
               if records and stem not in metrics and stem not in {file_name(name) for name in others}}
    last = {name: records[-1] for name, records in metrics.items() if records}
    earlier = since is not None and (len(own_stats(read_stats(run_dir))) > len(stats) or any(
        len(records) > len(metrics.get(name, [])) for name, records in own_metrics(read_metrics(run_dir)).items()))
    return {"wall_s": wall_s, **traffic(stats), "last_metrics": last, "earlier_runs": earlier,
            "other_processes": sorted(others), "findings": read_findings(run_dir, since)}


def blame(summary: dict[str, Any], failed: str | None, exit_codes: dict[str, int | None]) -> str | None:
    """The process a failed job names (``LaunchResult.failed``): the culprit of the servers' findings
    (``runs.findings.culprit``: who stopped sending) where they name one, else ``failed``, the first process that
    exited non-zero (often a healthy worker whose own wait ran out). Its words go to ``summary["cause"]``."""
    if failed is None:
        return None
    process, summary["cause"] = culprit(summary.get("findings", []), failed, exit_codes)
    return process


def _status(exit_code: int, failed: str | None, cause: str | None = None) -> str:
    if exit_code == 0:
        return "ok"
    if failed is None:
        return "interrupted"
    return f"FAILED ({cause or failed})"


def _traffic_lines(s: dict[str, Any]) -> list[str]:
    """The LAN and WAN lines: the stats files' totals (``runs.summary.traffic``), "unknown" where no process wrote
    its counters, and the processes whose count is the last one taken while they ran (the job did not end cleanly)."""
    if s.get("wan_bytes") is None:
        unknown = "unknown (no process wrote its counters)"
        return [f"LAN traffic   : {unknown}", f"WAN traffic   : {unknown}"]
    per_party = ", ".join(f"{k} {v / 1e6:.2f} MB" for k, v in s.get("wan_bytes_sent_by_party", {}).items())
    lines = [f"LAN traffic   : {s['lan_bytes'] / 1e6:.2f} MB",
             f"WAN traffic   : {s['wan_bytes'] / 1e6:.2f} MB  (sent per party: {per_party})"]
    if s.get("not_final"):
        lines.append(f"counted until : their last count for {', '.join(s['not_final'])} (stopped before a clean "
                     "exit): at least these")
    return lines


def summary_text(exit_code: int, failed: str | None, wall_s: float, s: dict[str, Any]) -> str:
    """What ``geomx launch`` prints at the end: status, wall time, traffic, each party's WAN streams and the workers'
    last metrics (``s``: ``summarize``'s). Usage: ``print(summary_text(0, None, 35.3, summarize(run_dir, 35.3)))``"""
    lines = ["", "=== geomx run summary ===",
             f"status        : {_status(exit_code, failed, s.get('cause'))}",
             f"wall time     : {wall_s:.1f} s",
             *_traffic_lines(s)]
    for party in s.get("wan_bytes_sent_by_party", {}):  # a collective party: one WAN stream per rank
        streams = {name.split("/", 1)[1]: sent for name, sent in s.get("wan_bytes_sent_by_process", {}).items()
                   if name.startswith(f"{party}/")}
        if len(streams) > 1:
            shown = ", ".join(f"{name} {sent / 1e6:.2f} MB" for name, sent in sorted(streams.items()))
            lines.append(f"WAN streams   : {party} {len(streams)} ({shown})")
    if s.get("earlier_runs"):
        lines.append("earlier runs  : left out (this run folder also holds an earlier run's counts and metrics: "
                     "`geomx report` covers the whole job)")
    if s.get("other_processes"):
        lines.append(f"other launches: left out ({', '.join(s['other_processes'])}: this run folder is shared with "
                     "another launcher's processes, e.g. another party's: `geomx report` covers the whole job)")
    for name, record in s.get("last_metrics", {}).items():
        shown = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in record.items()
                          if k != "time")
        lines.append(f"{name:<14}: {shown}")
    return "\n".join(lines)
