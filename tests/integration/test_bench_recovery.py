"""``geomx bench --only recovery`` at a tiny size: a collective party killed, declared dead, restarted, and its
recovery's parts measured from its ranks' own clocks (``geomx.bench.recovery``)."""

from __future__ import annotations

import pytest

from geomx.bench.recovery import RecoveryPlan, lines, measure, parts

pytestmark = pytest.mark.timeout(300)


def test_parts_add_up_from_the_restarted_ranks_stages():
    stages = {"main": 12.0, "model": 13.0, "setup": 14.0, "joined": 16.0, "ready": 17.0}
    ranks = {2: {"times": stages, "started_at": 17.5, "step_ends": [1.0, 2.5], "model_bytes": 4e6, "init_s": 0.25},
             3: {"times": {**stages, "joined": 16.5}, "started_at": 17.0, "step_ends": [1.0, 2.0],
                 "model_bytes": 4e6, "init_s": 0.5}}
    record = parts(ranks, [2, 3], killed_at=0.0, dead_at=5.0, restarted_at=10.0, h=2)
    assert record["detection_s"] == 5.0
    assert record["reform_s"] == 6.5 and record["join_s"] == 2.5  # the later rank's: the party formed then
    assert record["wrapper_s"] == 0.5 and record["state_s"] == 0.5 and record["state_mb_per_s"] == 8.0
    assert record["first_contribution_s"] == 3.0  # the later rank's second step ended at 17.5 + 2.5
    assert record["rejoin_s"] == 10.0 and record["kill_to_contribution_s"] == 20.0


def test_a_killed_collective_party_is_restarted_and_its_recovery_measured_in_parts(tmp_path):
    plan = RecoveryPlan(preset="tiny", h=10, step_ms=20.0, die_step=15, heartbeat_s=2.0, max_rounds=400,
                        timeout_s=240.0)
    section = measure(plan, tmp_path)
    assert not section["errors"], section["errors"]
    record = section["records"]["recovery"]
    # nobody is declared dead before its heartbeats have been silent for the timeout (less one interval, 0.5 s)
    assert record["detection_s"] >= plan.heartbeat_s - 0.5
    for part in ("reform_s", "imports_s", "model_s", "setup_s", "join_s", "state_s", "first_contribution_s"):
        assert record[part] > 0, part
    # the INIT is a part of a rank's wrapper start; the parts are measured to the later rank's ends (wrapper_s: the
    # last ready less the last joined), so a rank that joined early may spend longer in its INIT than wrapper_s
    # (0.0696 against 0.0676 s once): bounded by its start since the restart instead
    assert record["state_s"] < record["reform_s"] + record["wrapper_s"]
    together = record["reform_s"] + record["wrapper_s"] + record["first_contribution_s"]
    assert record["rejoin_s"] == pytest.approx(together)
    ranks = section["ranks"]
    assert [ranks[r]["steps"] for r in (2, 3)] == [2 * plan.h] * 2  # the restarted ranks' two outer rounds
    survivor = [ranks[r]["steps"] for r in (0, 1)]
    # dc0 stopped on the restarted dc1's file, both ranks at one step, two rounds after a round's end
    assert survivor[0] == survivor[1] < plan.h * plan.max_rounds and survivor[0] % plan.h == 0
    assert any("rejoin" in line for line in lines(section))
