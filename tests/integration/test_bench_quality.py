"""``geomx bench --only quality`` through its real path at a tiny size: single (one process) and two geomx jobs of
2 parties x 2 collective ranks (FSA in float32, DiLoCo with int8), a few steps each.

Checks the records' fields, that every row saw the same tokens and was evaluated at the same points, and that
``bytes_per_param`` is what the run's stats files say dc1 sent to the global servers (so int8 DiLoCo's is about a
quarter of float32 FSA's), not a figure made up from the codec's nominal ratio. The losses themselves are measured,
never asserted (but FSA's must match single's: the same arithmetic on the same batches).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from harness import worker_command

from geomx.bench import quality
from geomx.runs.runlog import read_stats
from geomx.runs.summary import traffic

pytestmark = pytest.mark.timeout(300)

# H = 2: an outer step every 2 steps, two in 4; small batches and few validation windows
TINY = replace(quality.BUDGET, steps=4, batch_size=4, eval_every=2, eval_windows=64, hfa=(1, 2), max_chars=300_000,
               timeout_s=240)


def test_quality_section_runs_single_fsa_and_int8_diloco_and_reads_bytes_from_the_stats_files(tmp_path: Path):
    rows = ("single", "fsa", "diloco_int8")
    section = quality.measure_rows(rows, TINY, tmp_path, command=lambda script, args: worker_command(script, *args))
    assert section["errors"] == []
    records = section["rows"]
    assert list(records) == list(rows)
    params = section["parameters"]
    assert params == 87680  # the tiny preset
    tokens = TINY.steps * TINY.batch_size * TINY.world * 64
    for name, record in records.items():
        for key in ("row", "val_loss", "val_loss_vs_ddp", "bytes_per_param", "wan_mb", "wall_s", "curve"):
            assert key in record, (name, key)
        assert record["row"] == name and record["tokens"] == tokens
        assert [p["step"] for p in record["curve"]] == [0, 2, 4]
        assert 0 < record["val_loss"] < 5.5 and record["wall_s"] > 0
        assert record["val_loss_vs_ddp"] is None  # no ddp row ran
    # every row starts from the same model, evaluated on the same windows
    assert len({round(r["curve"][0]["val_loss"], 6) for r in records.values()}) == 1
    # FSA on the collective path is DDP's arithmetic on the same global batches as single
    assert records["fsa"]["val_loss"] == pytest.approx(records["single"]["val_loss"], rel=1e-3)

    for name in ("fsa", "diloco_int8"):
        stats = read_stats(tmp_path / "runs" / f"quality-{name}")
        to_servers = sum(peer["sent"] for entry in stats if entry["party"] == "dc1"
                         for peer_name, peer in entry["peers"].items() if peer_name.startswith("dc0/global_server"))
        rounds = quality.outer_steps(next(r for r in quality.ROWS if r.name == name), TINY)
        assert records[name]["bytes_per_param"] == pytest.approx(to_servers / rounds / params)
        assert records[name]["wan_mb"] == pytest.approx(traffic(stats)["wan_bytes"] / 1e6)
    fsa, int8 = records["fsa"]["bytes_per_param"], records["diloco_int8"]["bytes_per_param"]
    assert 3.9 < fsa < 5.0  # float32 gradients, plus the messages' headers and the start-up
    assert int8 < fsa / 2.5  # int8: a byte and a bit per parameter against four
    assert records["single"]["bytes_per_param"] == 0.0 and records["single"]["wan_mb"] == 0.0
    assert (tmp_path / "quality.csv").is_file() and len(section["plots"]) >= 1
    assert "diloco_int8" in "\n".join(quality.lines(section))


def test_frozen_variance_adam_through_the_wrapper_is_the_single_process_one(tmp_path: Path):
    """FSA with ``FrozenVarianceAdam`` on the workers (the quality worker's ``frozen_adamw``, frozen after 2 of 8
    steps) ends where one process stepping it on the global batch does, and not where AdamW does: the wrapper steps
    the optimizer it was given, frozen phase included."""
    budget = replace(TINY, steps=8, eval_every=4)
    command = lambda script, args: worker_command(script, *args)  # noqa: E731
    params = quality.parameters(budget.preset)
    measured = {row.name: quality.measure_row(row, budget, tmp_path, params, command)["val_loss"] for row in (
        quality.QualityRow("single", "single"),
        quality.QualityRow("single_frozen", "single", optimizer="frozen_adamw", freeze_after=2),
        quality.QualityRow("fsa_frozen", optimizer="frozen_adamw", freeze_after=2))}
    assert measured["fsa_frozen"] == pytest.approx(measured["single_frozen"], rel=1e-3)
    assert abs(measured["single_frozen"] - measured["single"]) > 0.02  # 3.58 against 3.75 at this size
