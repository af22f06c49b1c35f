"""The quality section's arithmetic (bytes per parameter, ratios, goals), its topologies and the worker's batches.

The section itself runs real jobs: ``tests/integration/test_bench_quality.py``.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from geomx.bench import quality
from geomx.bench.workers.quality import global_batches, rank_part
from geomx.config.yaml_io import load_topology


def test_bytes_per_param_is_the_non_central_partys_sends_per_round_per_parameter():
    # dc0 (central) also holds the global server's answers to everyone: it is left out
    assert quality.bytes_per_param({"dc0": 10**9, "dc1": 4000}, "dc0", rounds=10, params=100) == pytest.approx(4.0)
    # several non-central parties: their mean
    assert quality.bytes_per_param({"dc0": 1, "dc1": 2000, "dc2": 6000}, "dc0", 10, 100) == pytest.approx(4.0)
    assert quality.bytes_per_param({"dc0": 5}, "dc0", 10, 100) is None  # nobody but the central party
    assert quality.bytes_per_param({"dc0": 5, "dc1": 0}, "dc0", 10, 100) is None  # nothing sent: not measured
    assert quality.bytes_per_param({"dc1": 400}, "dc0", 0, 100) is None


def test_sent_to_global_servers_counts_wan_data_not_the_schedulers_control_traffic():
    stats = [
        {"party": "dc1", "peers": {"global_scheduler": {"class": "wan", "sent": 900},
                                   "dc0/global_server/1-a": {"class": "wan", "sent": 1000}}},
        {"party": "dc1", "peers": {"dc0/global_server/1-a": {"class": "wan", "sent": 500}}},
        {"party": "dc0", "peers": {"dc0/global_server/1-a": {"class": "lan", "sent": 7000}}},
        {"party": "dc0", "name": "global_scheduler"},
    ]
    assert quality.sent_to_global_servers(stats) == {"dc1": 1500, "dc0": 0}


def test_outer_steps_are_steps_for_fsa_like_rows_and_steps_over_h_under_hfa():
    rows = {row.name: row for row in quality.ROWS}
    budget = quality.BUDGET
    assert budget.outer_every == budget.hfa[0] * budget.hfa[1]
    for name in ("fsa", "fsa_int8", "fsa_bsc", "fsa_bsc_frozen", "mixed", "mixed_dcasgd", "mixed_dcadam", "ssp"):
        assert quality.outer_steps(rows[name], budget) == budget.steps
    for name in ("diloco", "streaming", "diloco_int8", "diloco_bsc", "diloco_sparse2bit"):
        assert quality.outer_steps(rows[name], budget) == budget.steps // budget.outer_every
    assert quality.outer_steps(rows["diloco"], replace(budget, steps=3)) == 1  # fewer steps than H: never 0


def test_ratios_to_ddp_and_goals():
    records = {name: {"row": name, "val_loss": loss, "bytes_per_param": per_param} for name, loss, per_param in (
        ("single", 2.0, 0.0), ("ddp", 2.0, 6.0), ("fsa", 2.02, 4.0), ("diloco", 2.05, 4.0),
        ("diloco_int8", 2.05, 1.0), ("diloco_sparse2bit", 2.06, 0.04))}
    quality.add_ratios(records)
    assert records["ddp"]["val_loss_vs_ddp"] == 1.0
    assert records["diloco"]["val_loss_vs_ddp"] == pytest.approx(1.025)
    goals = quality.quality_goals(records)
    assert goals["fsa_vs_single"] == {"ratio": pytest.approx(1.01), "limit": 1.005, "met": False}
    assert goals["diloco_vs_ddp"]["met"] and goals["int8_vs_diloco"]["met"]
    assert goals["sparse2bit_vs_diloco"]["ratio"] == pytest.approx(2.06 / 2.05) and goals["sparse2bit_vs_diloco"]["met"]
    assert goals["sparse2bit_bytes"] == {"bytes_per_param": 0.04, "limit": 0.05, "met": True}
    del records["ddp"]
    quality.add_ratios(records)
    assert records["fsa"]["val_loss_vs_ddp"] is None  # no ddp row: no ratio, not a division by a missing loss
    assert quality.ratio_to(1.0, 0.0) is None and quality.ratio_to(None, 2.0) is None


def test_ddp_bytes_are_the_ring_all_reduce_share_of_four_bytes():
    assert pytest.approx(6.0) == quality.DDP_RING_BYTES_PER_PARAM  # 2 x 3/4 x 4 bytes with 4 ranks


def test_the_curves_wan_axis_is_pro_rata_by_steps():
    points = quality.with_wan([{"step": 0}, {"step": 25}, {"step": 50}], wan_bytes=2e6, steps=50)
    assert [p["wan_mb"] for p in points] == [0.0, 1.0, 2.0]


def test_every_row_is_named_once_and_the_goal_rows_are_rows():
    assert len(set(quality.ROW_NAMES)) == len(quality.ROW_NAMES) == 15
    assert set(quality.GOAL_ROWS) <= set(quality.ROW_NAMES)
    with pytest.raises(ValueError, match="unknown quality rows"):
        quality.measure_rows(("nope",), quality.BUDGET, Path("/nonexistent"))


def test_every_geomx_rows_topology_loads(tmp_path):
    for row in quality.ROWS:
        if row.kind != "geomx":
            continue
        path = quality.write_topology(tmp_path / f"{row.name}.yaml", quality.topology(row, quality.BUDGET))
        topology = load_topology(path)
        assert topology.collective_parties == ("dc0", "dc1"), row.name
        assert topology.size_lower_bound == 0
        assert (topology.hfa is not None) == row.hfa, row.name


def test_every_rank_reads_its_part_of_the_same_global_batches_as_single():
    count, world, per_rank, steps = 103, 4, 3, 20  # 8 global batches per epoch: the order repeats with a new seed
    single = list(global_batches(count, per_rank * world, steps, seed=0))
    assert len(single) == steps
    assert not torch.equal(single[0], single[8])  # the second epoch is another permutation
    for step, batch in enumerate(global_batches(count, per_rank * world, steps, seed=0)):
        parts = [rank_part(batch, rank, world) for rank in range(world)]
        assert all(len(part) == per_rank for part in parts)
        assert torch.equal(torch.cat(parts), single[step])
    assert torch.equal(rank_part(single[0], 0, 1), single[0])
    assert not torch.equal(next(global_batches(count, 12, 1, seed=1)), single[0])


def test_a_row_of_its_own_rate_and_sgd_reaches_the_workers():
    """A try with plain SGD on the workers at its own rate (what a codec costs without Adam's scaling)."""
    import argparse

    from geomx.bench.quality import BUDGET, QualityRow, worker_args
    from geomx.bench.workers.quality import make_optimizer

    args = worker_args(QualityRow("fsa_sgd", optimizer="sgd", lr=0.3), BUDGET, Path("curve.jsonl"))
    assert args[args.index("--optimizer") + 1] == "sgd" and args[args.index("--lr") + 1] == "0.3"
    assert worker_args(QualityRow("fsa"), BUDGET, Path("c"))[args.index("--lr") + 1] == str(BUDGET.lr)
    made = make_optimizer(argparse.Namespace(optimizer="sgd", lr=0.3, weight_decay=0.01), torch.nn.Linear(2, 2))
    assert type(made) is torch.optim.SGD and made.param_groups[0]["lr"] == 0.3


def test_the_frozen_row_reaches_its_workers_as_frozen_variance_adamw():
    """``fsa_bsc_frozen``: the codec's warm-up in its topology, FrozenVarianceAdam (AdamW) on the workers."""
    from geomx.bench.quality import BUDGET, ROWS, topology, worker_args
    from geomx.bench.workers.quality import make_optimizer, parse_args
    from geomx.torch import FrozenVarianceAdam

    row = {row.name: row for row in ROWS}["fsa_bsc_frozen"]
    assert topology(row, BUDGET)["training"]["compression"]["warmup_steps"] == 800
    args = parse_args(worker_args(row, BUDGET, Path("curve.jsonl")))
    made = make_optimizer(args, torch.nn.Linear(2, 2))
    assert type(made) is FrozenVarianceAdam and made.param_groups[0]["freeze_after"] == 120
    assert made.param_groups[0]["decoupled_weight_decay"] and made.param_groups[0]["weight_decay"] == 0.01
