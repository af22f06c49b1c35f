"""The chaos section's table for ``geomx bench``'s report: one block of rows per scenario's record.

Usage::

    print("\\n".join(lines(section)))
"""

from __future__ import annotations

from typing import Any

from ..tables import fmt, table


def slow_rows(record: dict[str, Any]) -> list[list[str]]:
    runs, goal = record["runs"], record["goal"]
    order = ("alone", "decoupled", "synchronous")
    return [["slow_party", "goodput", fmt(record["goodput"], ".3f"), f">= {goal['goodput']:g}",
             f"synchronous {fmt(record['goodput_synchronous'], '.3f')}"],
            ["", "steps/s alone / decoupled / sync", " / ".join(fmt(runs[v]["steps_per_s"], ".2f") for v in order),
             "", ""],
            ["", "longest stall s", " / ".join(fmt(runs[v].get("longest_stall_s"), ".1f") for v in order), "", ""],
            ["", "val loss", " / ".join(fmt(runs[v]["val_loss"], ".3f") for v in order), "", ""]]


def loss_beside(record: dict[str, Any], run: str) -> str:
    """``the faulty run's val loss against the baseline's`` (``-`` for a baseline left out)."""
    baseline = record["runs"]["baseline"]
    return f"{fmt(record['runs'][run]['val_loss'], '.3f')} against {fmt(baseline and baseline['val_loss'], '.3f')}"


def lost_rows(record: dict[str, Any]) -> list[list[str]]:
    goal = record["goal"]
    beside = "" if record["scenario"] == "party_lost" else f"rounds: {record['rounds']}"
    rows = [[record["scenario"], "others_stalled_s", fmt(record["others_stalled_s"], ".1f"),
             f"<= {goal['others_stalled_s']:g}", beside],
            ["", "rejoin_s", fmt(record["rejoin_s"], ".1f"), f"<= {goal['rejoin_s']:g}",
             "" if "restart_s" not in record else f"training again {fmt(record['restart_s'], '.1f')} s after the kill"],
            ["", "val_loss_ratio", fmt(record["val_loss_ratio"], ".4f"), f"<= {goal['val_loss_ratio']:g}",
             loss_beside(record, "lost")]]
    return rows


def restart_rows(record: dict[str, Any]) -> list[list[str]]:
    goal, run = record["goal"], record["runs"]["restarted"]
    return [["global_restart", "steps_lost", str(record["steps_lost"]), f"<= {goal['steps_lost']}",
             f"killed before step {run['kill_step']}, resumed at {run['resumed_at']}"],
            ["", "all_gone_s", fmt(record["all_gone_s"], ".1f"), "", "the kill to every process gone"],
            ["", "resume_s", fmt(record["resume_s"], ".1f"), "", "the kill to the resumed job's first step"],
            ["", "val_loss_ratio", fmt(record["val_loss_ratio"], ".4f"), f"<= {goal['val_loss_ratio']:g}",
             loss_beside(record, "restarted")]]


ROWS = {"slow_party": slow_rows, "party_lost": lost_rows, "rank_lost": lost_rows, "global_restart": restart_rows}


def lines(section: dict[str, Any]) -> list[str]:
    """The section's table for ``geomx bench``'s report."""
    p = section["plan"]
    ranks = f" (rank_lost: dc2 {p['collective_ranks']} collective ranks)" if "rank_lost" in section["records"] else ""
    out = [f"[chaos] 3 parties x 1 worker{ranks}, charlm {p['preset']}, {p['steps']} steps of {p['step_s']} s "
           f"emulated device time, HFA {p['hfa'][0]}x{p['hfa'][1]} + outer Nesterov 0.7 / 0.5; load avg "
           f"{section.get('load_avg_start')} -> {section.get('load_avg_end')}"]
    cells = [row for record in section["records"].values() for row in ROWS[record["scenario"]](record)]
    out += table(["scenario", "measure", "measured", "goal", "beside it"], cells)
    out += [f"error: {e}" for e in section.get("errors", [])]
    return out
