"""``geomx bench --only chaos`` through its real path at a tiny size: the slow_party scenario's three jobs (3
parties decoupled by a quorum of 2, the same synchronous, and the two fast parties alone), a few rounds each; the
rank_lost scenario (a rank of a collective party under ``torchrun --max-restarts 1`` killed, the party restarted by
torchrun's agent); the global_restart scenario (the global tier killed, the job resumed from its checkpoint). The
fault-free baselines of the loss ratios are left out (``baselines=False``): they are plain jobs.

Checks what each job trained (the slow party's steps: a third under the quorum, all of them synchronously; the
restarted ranks' steps from the step their rank died at; the resumed job's from its checkpoint), that the decoupled
job folded the slow party's late deltas in rather than dropping them (the global server's stats), that the
restarted ranks rejoined in place of the dead ones, that a resumed job loses no more than the checkpoint interval,
and the records' fields. The goodput, stalls and times themselves are measured, never asserted.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from harness import worker_command

from geomx.bench import chaos
from geomx.runs.checkpoint import load_latest

pytestmark = pytest.mark.timeout(300)

# grace 0: a round closes with the two fast parties, so the slow one (3x slower) misses each and is folded in late
TINY = chaos.ChaosPlan(steps=30, step_s=0.02, hfa=(5, 2), batch_size=4, timeout_s=240, grace="0")
# rank_lost: dc0 and dc1 must still train when dc2's ranks come back (the heartbeat timeout, then torchrun's restart
# of two cold ranks: ~5 s on 2 loaded cores), so 12 s of steps; global_restart: 1.5 s between the checkpoint of
# step 20 and the kill before step 35, for the global server's background write
FAULTS = chaos.ChaosPlan(steps=120, step_s=0.1, hfa=(5, 2), batch_size=4, timeout_s=240, baselines=False)
RESTART = chaos.ChaosPlan(steps=40, step_s=0.1, hfa=(5, 2), batch_size=4, timeout_s=240, baselines=False)


def warm(script, args):
    return worker_command(script, *args)


def test_slow_party_runs_decoupled_synchronous_and_alone_and_folds_the_slow_deltas(tmp_path: Path):
    section = chaos.measure(("slow_party",), TINY, tmp_path, command=warm)
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


def test_rank_lost_restarts_a_collective_partys_ranks_under_torchrun_and_they_rejoin(tmp_path: Path):
    section = chaos.measure(("rank_lost",), FAULTS, tmp_path, command=warm)
    assert section["errors"] == []
    record = section["records"]["rank_lost"]
    lost = record["runs"]["lost"]
    assert record["rounds"] == "quorum 2" and record["runs"]["baseline"] is None
    die_step = FAULTS.outer_every + FAULTS.hfa[0]
    assert lost["die_step"] == die_step == 15 and lost["lost_rank"] == 3
    ranks = lost["ranks"]
    assert {r: v["steps"] for r, v in ranks.items()} == {0: 120, 1: 120, 2: 120 - die_step, 3: 120 - die_step}
    # dc2's records are its second attempt's, going on from the step where its rank died
    assert [(ranks[r]["attempt"], ranks[r]["start_step"]) for r in (2, 3)] == [(1, die_step)] * 2
    assert [(ranks[r]["attempt"], ranks[r]["start_step"]) for r in (0, 1)] == [(0, 0)] * 2
    assert lost["rejoined_members"] == 2  # the global scheduler took each restarted rank in place of a dead one
    # the restarted ranks count steps from their restart: their model digests are not compared with the job's steps
    # (before, the global scheduler named dc2 as disagreeing on the model at step 0)
    assert lost["digest_warnings"] == 0
    assert 0 < record["restart_s"] < record["rejoin_s"]
    assert record["others_stalled_s"] >= 0 and record["val_loss_ratio"] is None and 0 < lost["val_loss"] < 6.0
    assert any(line.startswith("rank_lost") for line in chaos.lines(section))


def test_global_restart_resumes_from_the_last_checkpoint_and_loses_at_most_its_interval(tmp_path: Path):
    section = chaos.measure(("global_restart",), RESTART, tmp_path, command=warm)
    assert section["errors"] == []
    record = section["records"]["global_restart"]
    run = record["runs"]["restarted"]
    assert chaos.kill_step(RESTART) == run["kill_step"] == 35 and record["checkpoint_steps"] == 20
    assert all(code != 0 for code in run["crashed_exit"].values()), run["crashed_exit"]  # every party's launch
    assert run["checkpoint_step"] == 20  # the newest checkpoint before the kill (every 2 rounds of 10 steps)
    assert run["start_steps"] == {0: 20, 1: 20, 2: 20} and run["resumed_at"] == 20  # every worker resumed from it
    assert record["steps_lost"] == 15 <= record["checkpoint_steps"]
    assert {r: v["steps"] for r, v in run["ranks"].items()} == {0: 20, 1: 20, 2: 20}
    assert 0 < record["all_gone_s"] < record["resume_s"]
    snapshot = load_latest(tmp_path / "checkpoints" / "chaos-restart", 0)
    assert snapshot is not None and snapshot.step == 4  # the resumed job's own, at its end: 40 steps, 4 rounds
    assert record["val_loss_ratio"] is None and 0 < run["val_loss"] < 6.0
    assert any(line.startswith("global_restart") for line in chaos.lines(section))
