"""The WAN bench's arithmetic: time to target, ratios (lower bounds when DDP was cut), the table and goals."""

from __future__ import annotations

import pytest

from geomx.bench.wan import goals as wan_goals
from geomx.bench.wan import job as wan_job
from geomx.bench.wan import jobs as wan_jobs
from geomx.bench.wan import netns
from geomx.bench.wan import section as bench_wan


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
    block = {"job": "mlp", "title": "digits MLP", "metric": "accuracy", "higher_is_better": True, "margin": 0.01,
             "epochs": 10, "target": 0.96,
             "ddp_loopback": {"final_accuracy": 0.97, "time_to_target_s": 4.0, "step_s": 0.05},
             "rates": {"20": {"probe_mbit": {"a_to_b": 19.1, "b_to_a": 19.0}, "rows": rows}}}
    result = {"plan": {"epochs": 10, "cap_s": 240}, "sync_period": 10, "jobs": {"mlp": block}}
    text = "\n".join(bench_wan.wan_lines(result))
    assert ">=40.00x" in text and "torchft not installed" in text
    assert ("goal (mlp): 20 Mbit/s, geomx best (geomx_best) reaches the target >= 30x sooner than DDP on the link: "
            "40.00x -> met" in text)
    assert "congestion control" not in text  # a result of a tree that did not record it
    result["tcp_congestion"] = {"name": "bbr", "set": False}
    assert "; TCP congestion control bbr (the host default)" in "\n".join(bench_wan.wan_lines(result))
    result["tcp_congestion"] = {"name": "cubic", "set": True}
    assert "; TCP congestion control cubic (set)" in "\n".join(bench_wan.wan_lines(result))


def test_the_fsa_per_step_goal_is_said_for_collective_parties_when_they_ran():
    rows = {"ddp": {"time_to_target_s": 45.0, "steps": 110, "step_s": 0.6, "final_accuracy": 0.969},
            "geomx_fsa_collective": {"time_to_target_s": 35.0, "steps": 110, "step_s": 0.5, "final_accuracy": 0.969}}
    bench_wan.add_ratios(rows, {"time_to_target_s": 2.0})
    block = {"job": "mlp", "rates": {"100": {"rows": rows}}}
    text = "\n".join(wan_goals.goal_lines(block))
    assert ("goal (mlp): 100 Mbit/s, geomx FSA in collective parties >= 1.3x faster per step than DDP over all the "
            "ranks: 1.20x -> NOT met") in text
    del rows["geomx_fsa_collective"]
    assert "collective parties >= 1.3x" not in "\n".join(wan_goals.goal_lines(block))


def test_the_skip_reason_is_the_whole_section(monkeypatch, tmp_path):
    monkeypatch.setattr(bench_wan, "unavailable_reason", lambda: "needs root")
    assert bench_wan.run_wan(True, tmp_path) == {"skipped": "needs root"}


def test_geomx_bench_hands_the_links_congestion_control_to_the_section(monkeypatch, tmp_path):
    from geomx.bench.sections import BenchPlan
    from geomx.cli import build_parser

    args = build_parser().parse_args(["bench", "--only", "wan", "--congestion", "cubic"])
    assert args.congestion == "cubic"
    seen = {}
    monkeypatch.setattr(bench_wan, "run_wan", lambda quick, out, **kw: seen.update(kw) or {})
    bench_wan.run(BenchPlan(quick=True, wan_congestion=args.congestion), tmp_path)
    assert seen["congestion"] == "cubic"


def test_tbf_burst_covers_a_gso_segment_and_4_ms():
    args = netns.tbf_args(100.0)
    assert args[:3] == ["tbf", "rate", "100mbit"]
    assert int(args[args.index("burst") + 1]) >= max(64 * 1024, 100e6 / 8 * 0.004)


def _loss_records(*points: tuple[int, float, float]) -> list[dict]:
    return [{"step": s, "time": t, "val_loss": v, "compute_s": 0.1 * s, "calibrated_step_s": 0.05}
            for s, t, v in points]


def test_the_lm_job_reaches_a_validation_loss_target_from_above():
    lm = wan_jobs.job("lm")
    assert lm.metric == "val_loss" and not lm.higher_is_better
    assert lm.target(2.0) == pytest.approx(2.0 + lm.margin)  # one margin *worse* than DDP-on-loopback's final
    records = _loss_records((10, 1.0, 3.1), (20, 2.0, 2.06), (30, 3.0, 2.04), (40, 4.0, 1.98))
    assert bench_wan.time_to(records, 2.05, lm) == 3.0  # the first at or below the target, not above
    assert bench_wan.time_to(records, 1.5, lm) is None
    assert bench_wan.time_to(_records((5, 1.0, 0.97)), 0.95) == 1.0  # the MLP (accuracy) still counts upwards


def test_an_lm_summary_reads_the_validation_loss_and_the_table_says_so():
    lm = wan_jobs.job("lm")
    raw = {"system": "ddp", "records": _loss_records((10, 2.0, 2.5), (20, 4.0, 2.1)), "cut_at_cap": False,
           "failed": []}
    figures = bench_wan.summarize(raw, 2.2, lm)
    assert figures["final_accuracy"] == 2.1 and figures["time_to_target_s"] == 4.0  # the job's last evaluation
    assert figures["evaluations"] == [(10, 2.0, 2.5), (20, 4.0, 2.1)]
    worse = {"system": "x", "records": _loss_records((10, 1.0, 2.15), (20, 2.0, 2.3)), "cut_at_cap": False,
             "failed": []}  # 4x sooner to the target than DDP/DiLoCo, but ends at a higher loss
    rows = {"ddp": figures, "geomx_hfa_outer_h": bench_wan.summarize(worse, 2.2, lm), "diloco": figures}
    bench_wan.add_ratios(rows, {"time_to_target_s": 1.0})
    block = {"job": "lm", "title": "char transformer", "metric": "val_loss", "higher_is_better": False,
             "margin": lm.margin, "epochs": 2, "target": 2.2, "ddp_loopback": {"final_accuracy": 2.15},
             "rates": {"100": {"probe_mbit": {"a_to_b": 95.0, "b_to_a": 95.0}, "rows": rows}}}
    text = "\n".join(bench_wan.wan_lines({"plan": {"cap_s": 240}, "sync_period": 10, "jobs": {"lm": block}}))
    assert "target val_loss 2.2000 (DDP loopback final 2.1500 + 0.05)" in text and "final val_loss" in text
    # a higher validation loss is a worse final value: 4x sooner, yet the goal is not met
    assert "than diloco at the same H, final value no worse (2.300 vs 2.100): 4.00x -> NOT met" in text


def test_bisparse_takes_the_jobs_momentum_correction():
    lm_rows = {s.name: s for s in bench_wan.systems_for(wan_jobs.job("lm"))}
    mlp_rows = {s.name: s for s in bench_wan.systems_for(wan_jobs.job("mlp"))}
    assert lm_rows["geomx_bisparse"].compression["momentum"] == 0.0  # Adam keeps its own moments
    assert mlp_rows["geomx_bisparse"].compression["momentum"] == 0.9
    assert lm_rows["geomx_fsa"].compression is None


def test_job_choice():
    assert bench_wan.jobs_from(None) is None and bench_wan.jobs_from("all") == ("mlp", "lm")
    assert bench_wan.jobs_from("lm") == ("lm",)
    with pytest.raises(ValueError, match="unknown WAN job 'cnn'"):
        wan_jobs.job("cnn")


def test_extra_rows_run_only_when_named():
    default = [s.name for s in bench_wan.systems_for(wan_job.MLP)]
    assert "geomx_fsa_no_early" not in default and "ddp" in default
    named = bench_wan.systems_for(wan_job.MLP, ["geomx_fsa_no_early", "ddp", "geomx_fsa"])
    assert [s.name for s in named] == ["geomx_fsa_no_early", "ddp", "geomx_fsa"]  # the order asked: drift cancels
    assert named[0].topology_extra == {"early_answers": False}


def test_the_plain_average_row_runs_postlocalsgd_s_schedule():
    plain = {s.name: s for s in bench_wan.systems_for(wan_job.MLP)}["geomx_hfa_h"]
    assert plain.hfa == (1, bench_wan.H) and not plain.outer and plain.period == bench_wan.H


def test_the_same_h_goal_is_said_for_hfa_outer_dense_and_with_its_codec():
    def run(seconds: float, final: float, compression: dict | None, outer: bool = True) -> dict:
        return {"time_to_target_s": seconds, "final_accuracy": final, "steps": 110, "step_s": 0.1,
                "compute_util": 0.1, "settings": {"kind": "geomx", "hfa": (10, 1), "outer": outer,
                                                  "compression": compression}}
    rows = {"diloco": {**run(8.0, 0.969, None), "settings": {"kind": "diloco", "outer": False}},
            "local_sgd": {**run(6.0, 0.969, None), "settings": {"kind": "local_sgd", "outer": False}},
            "geomx_hfa_outer_h": run(6.4, 0.969, None),
            "geomx_hfa_h": run(5.0, 0.969, None, outer=False),
            "geomx_best": run(2.0, 0.978, {"type": "bsc"})}
    block = {"job": "mlp", "higher_is_better": True, "rates": {"100": {"rows": rows}}}
    text = "\n".join(bench_wan.goal_lines(block))
    assert "geomx HFA + outer, dense (the soonest such row) >= 1.3x sooner than diloco" in text
    assert "(0.969 vs 0.969): 1.25x -> NOT met" in text  # 8.0 / 6.4, the dense row, not the faster plain average
    assert "HFA + outer with its WAN codec (the soonest such row) >= 1.3x sooner than diloco at the same H, final " \
           "value no worse (0.978 vs 0.969): 4.00x -> met" in text
    assert "PostLocalSGD's schedule) >= 1.3x sooner than local_sgd at the same H, final value no worse " \
           "(0.969 vs 0.969): 1.20x -> NOT met" in text


def test_the_wrapper_rows_run_the_wrapper_with_the_optimizer_where_the_topology_puts_it(tmp_path):
    from geomx.bench.wan.runs import geomx_topology, geomx_worker
    from geomx.bench.wan.systems import systems_for

    fsa, default, server = systems_for(wan_job.MLP, ["geomx_fsa", "geomx_fsa_wrapper",
                                                     "geomx_fsa_wrapper_translate"])
    assert "geomx.bench.workers.wan_geomx" in geomx_worker(fsa, tmp_path, 3, "mlp")
    command = geomx_worker(server, tmp_path, 3, "mlp")
    assert "geomx.bench.workers.wan_torch" in command and "--compression" not in command
    assert geomx_topology(default)["training"] == {"server_optimizer": "auto"}
    assert geomx_topology(server)["training"] == {"server_optimizer": "translate"}
