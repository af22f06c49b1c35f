"""The kvstore calls' argument checks (``geomx.worker.calls``); ``tests/integration/test_kv_calls.py`` makes the
same calls in a real job, with two pushes of a key before its pull."""

from __future__ import annotations

import pytest
import torch

from geomx.core.sharding import ShardPlanner
from geomx.worker.calls import KnownKeys, UnknownKeyError, checked, paired


def _keys() -> KnownKeys:
    keys = KnownKeys(ShardPlanner(1, slice_elems=4), ["gs0"])
    keys.add(0, torch.zeros(3))
    keys.add(1, torch.zeros(10))
    return keys


def test_an_unknown_key_reads_as_written_and_is_still_a_key_error() -> None:
    with pytest.raises(KeyError) as caught:
        _keys().info(3)
    assert isinstance(caught.value, UnknownKeyError) and caught.value.key == 3
    assert str(caught.value) == "key 3 was never initialized: call kv.init(3, tensor) before pushing or pulling it " \
                                "(known keys: 0, 1)"
    with pytest.raises(UnknownKeyError, match=r"^key 0 was never initialized: .* \(no key is initialized yet\)$"):
        KnownKeys(ShardPlanner(1, slice_elems=4), ["gs0"]).info(0)


def test_a_closed_store_and_a_bad_key_type_keep_their_own_errors() -> None:
    keys = _keys()
    with pytest.raises(TypeError, match="keys are ints"):
        keys.info(True)  # type: ignore[arg-type]
    keys.closed = True
    with pytest.raises(RuntimeError, match="closed"):
        keys.info(3)


def test_lists_of_different_lengths_are_refused_by_the_call_and_both_counts() -> None:
    one = torch.zeros(3)
    assert paired("push", [0, 1], [one, one]) == [(0, one), (1, one)]
    assert paired("push", 0, one) == [(0, one)]
    with pytest.raises(ValueError, match=r"^push got 3 keys but 2 values: pass one tensor per key$"):
        paired("push", [0, 1, 2], [one, one])
    with pytest.raises(ValueError, match=r"^pull got 1 key but 2 outputs: "):
        paired("pull", 0, [one, one], "outputs")


def test_every_pair_is_checked_before_the_caller_gets_any() -> None:
    keys = _keys()
    with pytest.raises(UnknownKeyError):
        checked(keys, "push", [0, 3], [torch.zeros(3), torch.zeros(2)], "values")
    with pytest.raises(ValueError, match="pull of key 1: shape"):
        checked(keys, "pull", [0, 1], [torch.zeros(3), torch.zeros(2)], "outputs")
    [(key, _, info)] = checked(keys, "push", 1, torch.zeros(10), "values")
    assert key == 1 and len(info.slices) == 3  # (10 elements, 4 a slice at most)

