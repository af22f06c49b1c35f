"""The frontend bench's pairs measure one factor each (the bench itself is measured, never tested)."""

from __future__ import annotations

import dataclasses

import pytest

from geomx.bench.frontend import EFFECTS, P3_SLICE, ROWS, WHOLE, _merge, saving
from geomx.config import topology_from_dict


@pytest.mark.parametrize("effect, factor", [("priority", "priorities"), ("slicing", "slice_elems"),
                                            ("p3_switch", "slice_elems")])
def test_each_effect_compares_rows_that_differ_in_one_factor(effect, factor):
    faster, slower = EFFECTS[effect]
    for model in ("cnn", "deep"):
        a, b = ROWS.get(f"{model}_{faster}"), ROWS.get(f"{model}_{slower}")
        if a is None or b is None:
            continue
        differ = {f.name for f in dataclasses.fields(a) if getattr(a, f.name) != getattr(b, f.name)}
        assert differ == {factor}, (model, effect, differ)


def test_the_rows_topologies_carry_slices_and_priorities_to_the_workers():
    for name, row in ROWS.items():
        topology = topology_from_dict(row.topology())
        assert topology.training.priorities is row.priorities, name
        want = P3_SLICE if row.slice_elems == P3_SLICE else WHOLE
        got = topology.training.p3_slice_elems if topology.training.p3 else topology.slice_elems
        assert got == want, name


def test_repeats_keep_the_median_and_savings_compare_medians():
    runs = [{"step_ms": 100.0, "step_median_ms": 90.0}, {"step_ms": 300.0, "step_median_ms": 80.0},
            {"step_ms": 200.0, "step_median_ms": 400.0}]
    merged = _merge(runs)
    assert merged["step_ms"] == 200.0 and merged["step_median_ms"] == 90.0 and merged["runs"] == runs
    rows = {"cnn_p3": {"step_median_ms": 75.0}, "cnn_slices_fifo": {"step_median_ms": 100.0}}
    assert saving(rows, "cnn_p3", "cnn_slices_fifo") == pytest.approx(0.25)
    assert saving(rows, "cnn_p3", "cnn_whole_fifo") is None
