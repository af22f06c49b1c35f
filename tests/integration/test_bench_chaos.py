"""``geomx bench --only chaos`` through its real path at a tiny size: the slow_party scenario's three jobs (3
parties decoupled by a quorum of 2, the same synchronous, and the two fast parties alone), a few rounds each.

Checks what each job trained (the slow party's steps: a third under the quorum, all of them synchronously), that
the decoupled job folded the slow party's late deltas in rather than dropping them (the global server's stats),
and the record's fields. The goodput itself is measured, never asserted.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from harness import worker_command

from geomx.bench import chaos

pytestmark = pytest.mark.timeout(300)

# grace 0: a round closes with the two fast parties, so the slow one (3x slower) misses each and is folded in late
TINY = chaos.ChaosPlan(steps=30, step_s=0.02, hfa=(5, 2), batch_size=4, timeout_s=240, grace="0")


def test_slow_party_runs_decoupled_synchronous_and_alone_and_folds_the_slow_deltas(tmp_path: Path):
    section = chaos.measure(("slow_party",), TINY, tmp_path, command=lambda script, args: worker_command(script, *args))
    assert section["errors"] == []
    record = section["records"]["slow_party"]
    runs = record["runs"]
    assert set(runs) == {"decoupled", "synchronous", "alone"}
    assert TINY.slow_steps == 10
    assert {r: v["steps"] for r, v in runs["decoupled"]["ranks"].items()} == {0: 30, 1: 30, 2: 10}
    assert {r: v["steps"] for r, v in runs["synchronous"]["ranks"].items()} == {0: 30, 1: 30, 2: 30}
    assert {r: v["steps"] for r, v in runs["alone"]["ranks"].items()} == {0: 30, 1: 30}
    assert [v["slow"] for v in runs["decoupled"]["ranks"].values()] == [False, False, True]

    by_party = runs["decoupled"]["outer_rounds"]
    assert by_party["dc2/server"]["late_folded"] > 0 and by_party["dc2/server"]["dropped"] == 0, by_party
    assert by_party["dc0/server"]["missed"] == 0 and by_party["dc1/server"]["missed"] == 0, by_party
    assert runs["synchronous"]["outer_rounds"] is None  # no quorum: today's rounds
    for run in runs.values():
        assert run["steps_per_s"] > 0 and 0 < run["val_loss"] < 6.0
    assert record["goodput"] == pytest.approx(runs["decoupled"]["steps_per_s"] / runs["alone"]["steps_per_s"])
    assert any(line.startswith("slow_party") for line in chaos.lines(section))
