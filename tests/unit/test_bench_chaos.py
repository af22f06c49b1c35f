"""The chaos section's plan, topologies and arithmetic (its jobs run in tests/integration/test_bench_chaos.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from geomx.algorithms.hfa.quorum import decoupled_options
from geomx.bench import chaos, sections
from geomx.config.yaml_io import topology_from_dict


def test_the_slow_party_trains_whole_outer_steps_about_a_slowdown_fewer():
    assert chaos.ChaosPlan(steps=300, slowdown=3.0, hfa=(5, 2)).slow_steps == 100
    assert chaos.ChaosPlan(steps=200, slowdown=3.0, hfa=(5, 2)).slow_steps == 70  # 6.67 outer steps: 7
    assert chaos.ChaosPlan(steps=10, slowdown=3.0, hfa=(5, 2)).slow_steps == 10  # never none


def test_decoupled_topology_folds_a_slow_partys_deltas_and_synchronous_has_no_quorum():
    plan = chaos.ChaosPlan(slowdown=3.0)
    decoupled = topology_from_dict(chaos.topology(plan, chaos.PARTIES, quorum=2))
    options = decoupled_options(dict(decoupled.training.plugin_options), len(decoupled.parties))
    assert (options.quorum, options.stale_rounds, options.grace) == (2, 3, None)  # grace auto
    assert [p.name for p in decoupled.parties] == list(chaos.PARTIES) and decoupled.central == "dc0"
    synchronous = topology_from_dict(chaos.topology(plan, chaos.PARTIES[:2], quorum=None))
    assert decoupled_options(dict(synchronous.training.plugin_options)).quorum == 0
    assert len(synchronous.parties) == 2


def test_steps_per_second_is_the_fast_ranks_mean(tmp_path: Path):
    for rank, (steps, seconds) in enumerate([(100, 20.0), (100, 25.0), (30, 30.0)]):
        (tmp_path / f"rank{rank}.json").write_text(json.dumps({"rank": rank, "steps": steps, "seconds": seconds}))
    ranks = chaos.read_ranks(tmp_path)
    assert chaos.steps_per_s(ranks, [0, 1]) == pytest.approx((5.0 + 4.0) / 2)
    with pytest.raises(RuntimeError, match="no timing"):
        chaos.steps_per_s(ranks, [7])
    with pytest.raises(RuntimeError, match="no rank wrote"):
        chaos.read_ranks(tmp_path / "empty")


def test_the_section_is_in_the_table_and_refuses_an_unknown_scenario(tmp_path: Path):
    assert sections.section("chaos").module == "geomx.bench.chaos"
    with pytest.raises(ValueError, match="unknown chaos scenarios"):
        chaos.measure(("nope",), chaos.QUICK, tmp_path)


def test_the_longest_stall_is_a_fast_ranks_longest_gap_beyond_its_median_step():
    ranks = {0: {"step_ends": [0.1, 0.2, 0.3, 1.3, 1.4]}, 1: {"step_ends": [0.1, 0.2, 0.3, 0.4, 0.5]},
             2: {"step_ends": [0.0, 9.0]}}
    assert chaos.longest_stall_s(ranks, [0, 1]) == pytest.approx(0.9)  # rank 0's 1.0 s gap, its steps 0.1 s
    assert chaos.longest_stall_s(ranks, [1]) == pytest.approx(0.0)


def test_rank_lost_makes_dc2_a_collective_party_of_two_ranks_under_decoupled_rounds_or_synchronous():
    plan = chaos.ChaosPlan()
    parsed = topology_from_dict(chaos.rank_lost_topology(plan))
    dc2 = next(p for p in parsed.parties if p.name == "dc2")
    assert (dc2.num_workers, dc2.lan) == (2, "collective")
    assert decoupled_options(dict(parsed.training.plugin_options)).quorum == 2  # rounds: decoupled
    assert parsed.timeouts.heartbeat_s == plan.heartbeat_s
    # the quality section's outer step: at momentum 0.9 a delta folded a round late cost the job 25% of its loss
    assert dict(parsed.training.server_optimizer_params) == {"lr": 0.7, "momentum": 0.5}
    raw = chaos.rank_lost_topology(chaos.ChaosPlan(rank_lost_quorum=None))  # the one switch
    assert "quorum" not in raw["training"]


def test_global_restart_checkpoints_every_few_rounds_and_dies_between_two_checkpoints(tmp_path: Path):
    plan = chaos.ChaosPlan(steps=200, hfa=(5, 2), checkpoint_rounds=2)
    parsed = topology_from_dict(chaos.restart_topology(plan, Path("bench-results") / "ckpt"))
    # absolute: a relative folder would be taken from the topology file's, and the bench would read another one
    assert parsed.checkpoint.every_steps == 2 and parsed.checkpoint.dir == (Path("bench-results") / "ckpt").resolve()
    assert plan.checkpoint_steps == 20
    assert chaos.kill_step(plan) == 115  # the checkpoint of step 100, then 15 steps: between outer steps 110, 120
    assert chaos.kill_step(chaos.ChaosPlan(steps=40)) == 35  # never before the first checkpoint
