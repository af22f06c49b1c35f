"""Time to a target accuracy on the job's model: the sync and codecs sections rate their runs with this.

A run's records (one per epoch or round, from every recording worker) become per-party accuracy curves;
the job reached the target when its SLOWEST party did, and only after a global round (a model no global
average had touched yet does not count).

Usage::

    figures = summarize_sync_run(all_records(metrics), result.summary, result.wall_s)
    figures.update(reach_target(figures, 0.95))
"""

from __future__ import annotations

from typing import Any


def curve(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The points of one party's accuracy curve: steps, accuracy, seconds, WAN MB and global rounds so far."""
    return [{"steps": int(r["steps"]), "test_accuracy": float(r["test_accuracy"]), "elapsed_s": float(r["elapsed_s"]),
             "wan_mb": r.get("wan_mb"), "global_round": r.get("global_round")} for r in records]


def summarize_sync_run(records: list[dict[str, Any]], summary: dict[str, Any], wall_s: float) -> dict[str, Any]:
    """Per-run figures and each party's accuracy curve from the records (one per epoch or round).

    ``records`` come from every recording worker, grouped by their ``party`` (a record without one belongs to
    party ""); the first party met is the master's (``dc0_worker0`` sorts first): ``steps``, ``train_s`` and
    ``curve`` are its. ``test_accuracy`` is the lowest of the parties' last records (MixedSync: the worst
    party's final model). Usage: ``summarize_sync_run(all_records(metrics), result.summary, result.wall_s)``.
    """
    if not records:
        raise RuntimeError("no worker left metrics records")
    by_party: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        by_party.setdefault(str(record.get("party", "")), []).append(record)
    parties = {party: {"curve": curve(recs), "steps": int(recs[-1]["steps"]),
                       "test_accuracy": float(recs[-1]["test_accuracy"]), "train_s": float(recs[-1]["elapsed_s"])}
               for party, recs in by_party.items()}
    master = parties[next(iter(parties))]
    curves = [c for p in parties.values() for c in p["curve"]]
    return {
        "records": len(records),
        "steps": master["steps"],
        "test_accuracy": min(p["test_accuracy"] for p in parties.values()),
        "best_accuracy": max(c["test_accuracy"] for c in curves),
        "train_s": master["train_s"],
        "wall_s": wall_s,
        "wan_bytes_total": int(summary.get("wan_bytes", 0)),
        "lan_bytes_total": int(summary.get("lan_bytes", 0)),
        "curve": master["curve"],
        "parties": parties,
    }


def first_at_target(points: list[dict[str, Any]], target: float) -> int | None:
    """Index of the first point at or above ``target`` that was taken after a global round, else None.

    A point with ``global_round`` 0 (or below) evaluated a model no global average had touched yet (HFA's
    local models before the first WAN exchange): it does not count. A point without ``global_round`` (a
    script that does not say) counts as it is.
    """
    for index, point in enumerate(points):
        rounds = point.get("global_round")
        if rounds is not None and rounds < 1:
            continue
        if point["test_accuracy"] >= target - 1e-9:
            return index
    return None


NOT_REACHED = {"reached": False, "time_to_target_s": None, "steps_to_target": None, "global_rounds_to_target": None,
               "wan_bytes_to_target": None, "wan_bytes_to_target_estimated": False}


def reach_target(figures: dict[str, Any], target: float) -> dict[str, Any]:
    """When the job reached ``target``: the SLOWEST party's first point at target (see ``first_at_target``).

    Returns its elapsed seconds, steps, global rounds and WAN bytes by then, which party it was, and every
    party's time. A party that recorded but never reached the target: not reached. The WAN bytes come from
    the point's ``wan_mb`` (every WAN byte of the job so far, read from the global servers); for a script
    that records none, the launcher's total pro rata by that party's records, marked estimated.
    """
    parties = figures.get("parties") or {"": {"curve": figures["curve"]}}
    hits = {party: first_at_target(p["curve"], target) for party, p in parties.items()}
    missing = sorted(party for party, index in hits.items() if index is None)
    if missing:
        return {**NOT_REACHED, "not_reached_by": missing}
    times = {party: parties[party]["curve"][index]["elapsed_s"] for party, index in hits.items()}
    slowest = max(times, key=lambda party: times[party])
    points, index = parties[slowest]["curve"], hits[slowest]
    point = points[index]
    estimated = point.get("wan_mb") is None
    wan = (figures["wan_bytes_total"] * (index + 1) / len(points)) if estimated else point["wan_mb"] * 1e6
    return {"reached": True, "time_to_target_s": point["elapsed_s"], "steps_to_target": point["steps"],
            "global_rounds_to_target": point.get("global_round"), "records_to_target": index + 1,
            "wan_bytes_to_target": wan, "wan_bytes_to_target_estimated": estimated, "slowest_party": slowest,
            "party_time_to_target_s": times}


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator, or None when either was not measured (or the denominator is 0)."""
    return numerator / denominator if numerator is not None and denominator else None
