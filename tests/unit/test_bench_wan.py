"""The WAN bench's arithmetic: time to target, ratios (lower bounds when DDP was cut), the table and goals."""

from __future__ import annotations

import pytest

from geomx import netns
from geomx.bench import wan as bench_wan


def _records(*points: tuple[int, float, float]) -> list[dict]:
    return [{"step": s, "time": t, "accuracy": a, "compute_s": 0.1 * s, "calibrated_step_s": 0.05}
            for s, t, a in points]


def test_time_to_target_is_the_first_evaluation_at_or_above_it():
    records = _records((5, 1.0, 0.80), (10, 2.0, 0.95), (15, 3.0, 0.93), (20, 4.0, 0.97))
    assert bench_wan.time_to(records, 0.95) == 2.0
    assert bench_wan.time_to(records, 0.99) is None


def test_summary_takes_figures_from_the_last_evaluation_and_the_counters():
    raw = {"system": "x", "records": _records((10, 2.0, 0.9), (20, 5.0, 0.96)), "cut_at_cap": False,
           "failed": [], "bytes": {"a_to_b": 3_000_000, "b_to_a": 1_000_000}}
    figures = bench_wan.summarize(raw, 0.95)
    assert figures["steps"] == 20 and figures["final_accuracy"] == 0.96 and figures["time_to_target_s"] == 5.0
    assert figures["step_s"] == pytest.approx(0.25)
    assert figures["compute_util"] == pytest.approx(20 * 0.05 / 5.0)
    assert (figures["mb_a_to_b"], figures["mb_b_to_a"]) == (3.0, 1.0)


def test_ratios_against_ddp_and_loopback_and_a_cut_ddp_gives_a_lower_bound():
    rows = {"ddp": {"time_to_target_s": 60.0, "step_s": 0.6}, "geomx_best": {"time_to_target_s": 5.0, "step_s": 0.4}}
    bench_wan.add_ratios(rows, {"time_to_target_s": 4.0})
    assert rows["geomx_best"]["vs_ddp_link"] == pytest.approx(12.0)
    assert rows["geomx_best"]["vs_loopback"] == pytest.approx(1.25)
    assert rows["geomx_best"]["step_speedup_vs_ddp"] == pytest.approx(1.5)
    assert not rows["geomx_best"]["vs_ddp_link_is_lower_bound"]
    cut = {"ddp": {"time_to_target_s": None, "cut_at_cap": True, "train_s": 240.0},
           "geomx_best": {"time_to_target_s": 6.0}}
    bench_wan.add_ratios(cut, {"time_to_target_s": 4.0})
    assert cut["geomx_best"]["vs_ddp_link"] == pytest.approx(40.0)
    assert cut["geomx_best"]["vs_ddp_link_is_lower_bound"]


def test_table_marks_lower_bounds_and_says_whether_goals_are_met():
    rows = {"ddp": {"time_to_target_s": None, "cut_at_cap": True, "train_s": 240.0, "steps": 60, "step_s": 4.0,
                    "final_accuracy": 0.9, "compute_util": 0.02},
            "geomx_best": {"time_to_target_s": 6.0, "steps": 110, "step_s": 0.1, "final_accuracy": 0.97,
                           "compute_util": 0.5},
            "diloco": {"skipped": "torchft not installed"}}
    bench_wan.add_ratios(rows, {"time_to_target_s": 4.0})
    result = {"plan": {"epochs": 10, "cap_s": 240}, "margin": 0.01, "sync_period": 10, "target": 0.96,
              "ddp_loopback": {"final_accuracy": 0.97, "time_to_target_s": 4.0, "step_s": 0.05},
              "rates": {"20": {"probe_mbit": {"a_to_b": 19.1, "b_to_a": 19.0}, "rows": rows}}}
    text = "\n".join(bench_wan.wan_lines(result))
    assert ">=40.00x" in text and "torchft not installed" in text
    assert "geomx best reaches the target >= 30x sooner than DDP on the link: 40.00x -> met" in text


def test_the_skip_reason_is_the_whole_section(monkeypatch, tmp_path):
    monkeypatch.setattr(bench_wan, "unavailable_reason", lambda: "needs root")
    assert bench_wan.run_wan(True, tmp_path) == {"skipped": "needs root"}


def test_tbf_burst_covers_a_gso_segment_and_4_ms():
    args = netns.tbf_args(100.0)
    assert args[:3] == ["tbf", "rate", "100mbit"]
    assert int(args[args.index("burst") + 1]) >= max(64 * 1024, 100e6 / 8 * 0.004)
