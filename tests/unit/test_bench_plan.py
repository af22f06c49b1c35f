"""`geomx bench --scenario` picks the sync section's rows (the benches themselves are measured, never tested)."""

from __future__ import annotations

import pytest

from geomx.bench import FULL, SYNC_BASELINE, bench_plan
from geomx.cli import build_parser


def test_the_wide_scenario_alone_runs_its_baseline_and_both_hfa_rows():
    args = build_parser().parse_args(["bench", "--only", "sync", "--scenario", "wide"])
    assert args.scenario == ["wide"] and args.only == ["sync"]
    plan = bench_plan(quick=False, sync_scenarios=args.scenario)
    assert [r.name for r in plan.sync_rows] == [f"{SYNC_BASELINE}_wide", "hfa_wide", "hfa_outer_wide"]
    assert plan.workloads == FULL.workloads  # only the sync rows change
    assert bench_plan(quick=False) is FULL
    assert not bench_plan(quick=True, sync_scenarios=["wide"]).sync_rows  # the quick run has no wide rows


def test_an_unknown_scenario_is_refused_by_the_command_line(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "--scenario", "huge"])
    assert "invalid choice: 'huge'" in capsys.readouterr().err
