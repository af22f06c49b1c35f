"""The sync bench's time to target: the job's model, the slowest party, never before the first global round.

Pure functions over metric records as the example scripts write them (``party``, ``global_round``,
``test_accuracy``, ``elapsed_s``, ``wan_mb``); the bench itself is measured, never tested.
"""

from __future__ import annotations

from typing import Any

from geomx.bench.jobs import all_records
from geomx.bench.targets import first_at_target, reach_target, summarize_sync_run


def record(party: str, global_round: int | None, accuracy: float, elapsed_s: float, wan_mb: float,
           steps: int | None = None) -> dict[str, Any]:
    out = {"party": party, "steps": steps if steps is not None else (global_round or 0) * 10,
           "test_accuracy": accuracy, "elapsed_s": elapsed_s, "wan_mb": wan_mb}
    if global_round is not None:
        out["global_round"] = global_round
    return out


SUMMARY = {"wan_bytes": 50_000_000, "lan_bytes": 1_000}


def test_the_slowest_party_sets_the_time_and_its_rounds_and_bytes_are_reported():
    records = [
        record("dc0", 11, 0.80, 1.0, 5.0), record("dc0", 22, 0.95, 2.0, 10.0), record("dc0", 33, 0.97, 3.0, 15.0),
        record("dc1", 4, 0.70, 3.0, 12.0), record("dc1", 8, 0.90, 6.0, 20.0), record("dc1", 12, 0.96, 9.0, 30.0),
    ]
    figures = summarize_sync_run(records, SUMMARY, wall_s=12.0)
    assert set(figures["parties"]) == {"dc0", "dc1"}
    assert figures["steps"] == 330 and figures["train_s"] == 3.0  # the first party met (the master's)
    assert figures["test_accuracy"] == 0.96  # the lowest of the parties' last records
    hit = reach_target(figures, 0.95)
    assert hit["reached"] and hit["slowest_party"] == "dc1"
    assert hit["time_to_target_s"] == 9.0  # dc1's, not dc0's 2.0
    assert hit["global_rounds_to_target"] == 12 and hit["wan_bytes_to_target"] == 30e6
    assert hit["party_time_to_target_s"] == {"dc0": 2.0, "dc1": 9.0}


def test_a_target_reached_before_the_first_global_round_does_not_count():
    # HFA: dc0's local model scores 0.97 before any global average (round 0); the global model reaches 0.95
    # only after the second global round
    curve_records = [record("dc0", 0, 0.97, 1.0, 6.4), record("dc0", 1, 0.90, 4.0, 7.0),
                     record("dc0", 2, 0.96, 8.0, 7.6)]
    figures = summarize_sync_run(curve_records, SUMMARY, wall_s=10.0)
    assert first_at_target(figures["curve"], 0.95) == 2
    hit = reach_target(figures, 0.95)
    assert hit["reached"] and hit["time_to_target_s"] == 8.0 and hit["global_rounds_to_target"] == 2
    assert hit["wan_bytes_to_target"] == 7.6e6


def test_a_party_that_never_reaches_the_target_means_not_reached():
    records = [record("dc0", 10, 0.97, 1.0, 5.0), record("dc1", 3, 0.91, 5.0, 9.0), record("dc1", 6, 0.93, 9.0, 12.0)]
    hit = reach_target(summarize_sync_run(records, SUMMARY, wall_s=10.0), 0.95)
    assert not hit["reached"] and hit["time_to_target_s"] is None and hit["not_reached_by"] == ["dc1"]


def test_records_without_party_or_rounds_are_one_party_and_count_as_they_are():
    # the codecs section's scripts record neither: one curve, every record counts; no wan_mb: pro rata
    records = [{"steps": 10, "test_accuracy": 0.5, "elapsed_s": 1.0}, {"steps": 20, "test_accuracy": 0.96,
                                                                       "elapsed_s": 2.0}]
    hit = reach_target(summarize_sync_run(records, SUMMARY, wall_s=3.0), 0.95)
    assert hit["reached"] and hit["time_to_target_s"] == 2.0
    assert hit["wan_bytes_to_target_estimated"] and hit["wan_bytes_to_target"] == SUMMARY["wan_bytes"]


def test_every_workers_records_are_read_master_first():
    metrics = {"dc1_worker0": [record("dc1", 1, 0.9, 2.0, 1.0)], "dc0_worker0": [record("dc0", 1, 0.8, 1.0, 1.0)],
               "dc0_worker1": []}
    merged = all_records(metrics)
    assert [r["worker"] for r in merged] == ["dc0_worker0", "dc1_worker0"]
    assert next(iter(summarize_sync_run(merged, SUMMARY, wall_s=1.0)["parties"])) == "dc0"
