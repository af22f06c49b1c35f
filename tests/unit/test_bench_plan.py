"""`geomx bench --scenario` picks the sync section's rows (the benches themselves are measured, never tested)."""

from __future__ import annotations

import pytest

from geomx.bench.sync import SYNC_BASELINE, sync_rows
from geomx.cli import build_parser


def test_the_wide_scenario_alone_runs_its_baseline_and_both_hfa_rows():
    args = build_parser().parse_args(["bench", "--only", "sync", "--scenario", "wide"])
    assert args.scenario == ["wide"] and args.only == ["sync"]
    rows = sync_rows(quick=False, scenarios=tuple(args.scenario))
    assert [r.name for r in rows] == [f"{SYNC_BASELINE}_wide", "hfa_wide", "hfa_outer_wide"]
    assert sync_rows(quick=False, scenarios=()) == sync_rows(quick=False)  # no scenario: every row
    assert len(sync_rows(quick=False)) > len(rows)
    assert not sync_rows(quick=True, scenarios=("wide",))  # the quick run has no wide rows


def test_an_unknown_scenario_is_refused_by_the_command_line(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "--scenario", "huge"])
    assert "invalid choice: 'huge'" in capsys.readouterr().err
