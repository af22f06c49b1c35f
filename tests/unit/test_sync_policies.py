"""The sync-policy plug-ins and their registry, in one process."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from geomx.algorithms.fsa.server import FullySynchronous
from geomx.algorithms.hfa.rules import LocalFrequencyAggregation
from geomx.algorithms.hfa.server import HfaAggregation
from geomx.algorithms.mixed_sync.server import Asynchronous
from geomx.algorithms.registry import SYNC_POLICIES, sync_policy
from geomx.core.plugins import Aggregation


def test_fsa_waits_for_every_awaited_client_and_scales_a_partial_round_to_the_full_tier() -> None:
    fsa = FullySynchronous()
    assert not fsa.round_complete({"a"}, {"a", "b"}) and fsa.round_complete({"a", "b"}, {"a", "b"})
    total = np.array([3.0, 6.0])
    np.testing.assert_array_equal(fsa.rescale(total, present=3, full=4), [4.0, 8.0])
    assert fsa.rescale(total, present=4, full=4) is total and fsa.rescale(total, present=0, full=4) is total
    assert not fsa.clients_leave_independently


def test_mixed_sync_applies_every_push_alone_and_unscaled() -> None:
    mixed = Asynchronous()
    assert mixed.round_complete({"a"}, {"a", "b"}) and not mixed.round_complete(set(), {"a"})
    total = np.array([3.0])
    assert mixed.rescale(total, present=1, full=4) is total and mixed.clients_leave_independently


def test_the_registry_names_every_policy_and_refuses_an_unknown_one() -> None:
    assert set(SYNC_POLICIES) == {"dist_sync", "dist_async", "dist_ssp"}
    assert isinstance(sync_policy("dist_async"), Asynchronous)
    valid = "\\['dist_async', 'dist_ssp', 'dist_sync'\\]"
    with pytest.raises(ValueError, match=f"unknown kvstore type 'dist_nope'; valid: {valid}"):
        sync_policy("dist_nope")


@pytest.mark.parametrize("usual", [True, False])
def test_hfa_drops_a_dead_party_on_the_global_tier_only(make_server: Any, usual: bool) -> None:
    assert Aggregation().may_drop(usual) is usual
    assert HfaAggregation(make_server("gs", ["ls0"]), None, hips=True).may_drop(usual)
    local = HfaAggregation(make_server("ls", ["w0"]), LocalFrequencyAggregation(2, 0.5), hips=True)
    assert not local.may_drop(usual)
