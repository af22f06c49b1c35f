"""ESync's step assignment (a pure function)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from geomx.algorithms.esync.rules import MAX_STEPS, assign_steps


def test_the_slowest_gets_base_steps_and_the_others_fill_the_same_time():
    steps = assign_steps({"a": 0.03, "b": 0.01, "c": 0.02}, base_steps=2)
    assert steps == {"a": 2, "b": 6, "c": 3}


@given(st.dictionaries(st.text(min_size=1, max_size=5), st.floats(1e-4, 10.0), min_size=1, max_size=8),
       st.integers(1, 50))
def test_nobody_outruns_the_slowest_round(speeds, base):
    steps = assign_steps(speeds, base)
    slowest = max(speeds.values())
    for name, seconds in speeds.items():
        assert 1 <= steps[name] <= MAX_STEPS
        if steps[name] > 1:
            assert steps[name] * seconds <= base * slowest * (1 + 1e-6)
        if steps[name] < MAX_STEPS:
            assert (steps[name] + 1) * seconds > base * slowest * (1 - 1e-6)
    assert steps[max(speeds, key=speeds.__getitem__)] == base


@pytest.mark.parametrize("speeds,base", [({"a": 0.0}, 1), ({"a": -1.0}, 1), ({"a": math.nan}, 1), ({"a": 1.0}, 0)])
def test_invalid_reports(speeds, base):
    with pytest.raises(ValueError):
        assign_steps(speeds, base)
