"""Slice plans, shard placement, the digits data set and its per-worker shards."""

from __future__ import annotations

import collections
import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from geomx.config import node_config_from_env, topology_from_dict
from geomx.core.sharding import ShardPlanner, SliceSpan, even_split, slice_plan
from geomx.zoo.data import Dataset, digits_split, steps_per_epoch

# ---------------------------------------------------------------------------------------------------------
# slice_plan / ShardPlanner


@st.composite
def numel_and_slice(draw):
    """Sizes up to 10**10 elements, with at most ~5000 slices so each example stays cheap."""
    numel = draw(st.integers(1, 10**4) | st.integers(1, 10**10))
    slice_elems = draw(st.integers(max(1, numel // 5000), max(1, numel // 5000) + 2 * numel))
    return numel, slice_elems


@settings(max_examples=300, deadline=None)
@given(numel_and_slice())
def test_slice_plan_covers_exactly_without_overlap(sizes):
    numel, slice_elems = sizes
    plan = slice_plan(numel, slice_elems)
    assert plan[0][0] == 0
    assert plan[-1][1] == numel
    for (_, stop), (next_start, _) in itertools.pairwise(plan):
        assert stop == next_start  # contiguous: no gap, no overlap
    assert all(0 < stop - start <= slice_elems for start, stop in plan)
    assert sum(stop - start for start, stop in plan) == numel
    assert len(plan) == -(-numel // slice_elems)  # as few slices as possible
    # only the last slice may be short
    assert all(stop - start == slice_elems for start, stop in plan[:-1])


@pytest.mark.parametrize("numel,slice_elems,plan", [
    (10, 3, [(0, 3), (3, 6), (6, 9), (9, 10)]),
    (9, 3, [(0, 3), (3, 6), (6, 9)]),
    (1, 100, [(0, 1)]),
    (3_000_000, 1 << 20, [(0, 1048576), (1048576, 2097152), (2097152, 3000000)]),
])
def test_slice_plan_examples(numel, slice_elems, plan):
    assert slice_plan(numel, slice_elems) == plan


@pytest.mark.parametrize("numel", [0, -1])
def test_slice_plan_empty_tensor(numel):
    assert slice_plan(numel, 8) == [(0, 0)]


@settings(max_examples=200, deadline=None)
@given(numel=st.integers(0, 10**7), slice_elems=st.integers(1000, 10**6), servers=st.integers(1, 8))
def test_planner_covers_the_tensor_and_splits_large_ones_evenly(numel, slice_elems, servers):
    slices = ShardPlanner(servers, slice_elems).place(numel, 4)
    assert slices[0].start == 0 and slices[-1].stop == numel
    assert all(a.stop == b.start for a, b in itertools.pairwise(slices))
    assert all(p.numel <= slice_elems for p in slices)
    if numel > slice_elems:  # large: equal slices, the same number on every shard
        assert len(slices) % servers == 0
        assert max(p.numel for p in slices) - min(p.numel for p in slices) <= 1
        count = collections.Counter(p.shard for p in slices)
        assert sorted(count) == list(range(servers)) and len(set(count.values())) == 1
    else:
        assert len(slices) == 1


def test_default_slicing_cuts_a_1024x1024_weight_when_a_wan_joins_parties():
    """With two parties the digits MLP's 1M-element weight is several slices by default (a slice's answer
    comes back while later slices are still pushed on a full-duplex link), each still big enough for
    Bi-Sparse to sparsify; one party keeps one slice (fewer messages on a LAN); P3 keeps its 50K slices."""
    two = topology_from_dict({"parties": {"dc0": 2, "dc1": 2}})
    slices = ShardPlanner(1, two.slice_elems).place(1024 * 1024, 4)
    assert len(slices) >= 4
    assert all(p.numel >= two.size_lower_bound for p in slices)  # Bi-Sparse still sparsifies each slice
    one = topology_from_dict({"parties": {"dc0": 4}})
    assert len(ShardPlanner(1, one.slice_elems).place(1024 * 1024, 4)) == 1
    env = {"GEOMX_ROLE": "worker", "GEOMX_PARTY": "dc0", "GEOMX_GLOBAL_SCHEDULER": "127.0.0.1:1",
           "GEOMX_SCHEDULER": "127.0.0.1:2", "ENABLE_P3": "1"}
    p3 = node_config_from_env(env).topology
    assert p3.slice_elems == p3.training.p3_slice_elems == 50_000


def test_planner_balances_the_bytes_of_small_tensors():
    planner = ShardPlanner(num_servers=2, slice_elems=1000)
    shards = [planner.place(n, 4)[0].shard for n in (800, 100, 100, 500, 300)]
    # lightest first: 800 -> 0; 100 -> 1; 100 -> 1 (200 < 800); 500 -> 1 (700); 300 -> 1 (700 < 800 -> 1000)
    assert shards == [0, 1, 1, 1, 1]
    assert planner.loads == [3200, 4000]
    big = planner.place(4000, 4)  # large: 4 slices of 1000, 2 per shard, whatever the loads
    assert [p.shard for p in big] == [0, 1, 0, 1]
    assert planner.loads == [11200, 12000]


def test_planner_is_deterministic_and_validates():
    sizes = [5, 3000, 7, 7, 120, 9000, 1]
    plans = [[ShardPlanner(4, 1000).place(n, 2) for n in sizes] for _ in range(2)]
    assert plans[0] == plans[1]
    spans = [(0, 8), (8, 17), (17, 26), (26, 35)]
    assert ShardPlanner(1, 10).place(35, 4) == tuple(SliceSpan(a, b, 0) for a, b in spans)
    with pytest.raises(ValueError, match="num_servers"):
        ShardPlanner(0, 10)
    with pytest.raises(ValueError, match="num_slices"):
        even_split(10, 0)


# ---------------------------------------------------------------------------------------------------------
# Data


@pytest.fixture(scope="module")
def digits() -> tuple[Dataset, Dataset]:
    return digits_split()


def test_digits_split_sizes_and_format(digits):
    train, test = digits
    assert len(train) + len(test) == 1797
    assert len(train) == int(1797 * 0.8) and len(test) == 1797 - int(1797 * 0.8)
    for subset in digits:
        assert subset.images.shape == (len(subset), 1, 8, 8)
        assert subset.images.dtype == torch.float32 and subset.labels.dtype == torch.int64
        assert float(subset.images.min()) >= 0.0 and float(subset.images.max()) <= 1.0
        assert set(subset.labels.tolist()) == set(range(10))


def _rows(dataset: Dataset) -> collections.Counter:
    return collections.Counter(
        (tuple(img.flatten().tolist()), int(label)) for img, label in zip(dataset.images, dataset.labels, strict=True))


def test_digits_split_is_disjoint_and_complete(digits):
    from sklearn.datasets import load_digits

    train, test = digits
    raw = load_digits()
    everything = Dataset(torch.tensor(raw.images, dtype=torch.float32).unsqueeze(1) / 16.0,
                         torch.tensor(raw.target, dtype=torch.int64))
    # train + test is exactly the data set (as a multiset: a few digits images are duplicates)
    assert _rows(train) + _rows(test) == _rows(everything)


def test_digits_split_is_deterministic_per_seed():
    a_train, _ = digits_split(seed=0)
    b_train, _ = digits_split(seed=0)
    c_train, _ = digits_split(seed=1)
    assert torch.equal(a_train.labels, b_train.labels) and torch.equal(a_train.images, b_train.images)
    assert not torch.equal(a_train.labels, c_train.labels)
    small_train, small_test = digits_split(test_fraction=0.5)
    assert len(small_train) == int(1797 * 0.5) and len(small_test) == 1797 - int(1797 * 0.5)


def _toy(n: int) -> Dataset:
    return Dataset(torch.arange(n, dtype=torch.float32).reshape(n, 1, 1, 1).expand(n, 1, 8, 8).clone(),
                   torch.arange(n))


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 300), count=st.integers(1, 12))
def test_dataset_shard_partitions(n, count):
    data = _toy(n)
    shards = [data.shard(i, count) for i in range(count)]
    ids = [int(label) for shard in shards for label in shard.labels]
    assert sorted(ids) == list(range(n))  # disjoint and covering
    sizes = [len(s) for s in shards]
    assert max(sizes) - min(sizes) <= (1 if n else 0)  # balanced
    for shard in shards:  # images travel with their labels
        assert torch.equal(shard.images[:, 0, 0, 0].long(), shard.labels)


@pytest.mark.parametrize("index,count", [(-1, 3), (3, 3), (0, 0)])
def test_dataset_shard_bad_index(index, count):
    with pytest.raises(ValueError, match="shard index"):
        _toy(10).shard(index, count)


@pytest.mark.parametrize("num_shards,batch_size", [(1, 32), (2, 32), (3, 16), (4, 32), (7, 10), (12, 8)])
def test_steps_per_epoch_equal_for_all_shards(digits, num_shards, batch_size):
    train, _ = digits
    steps = steps_per_epoch(len(train), num_shards, batch_size)
    assert steps == (len(train) // num_shards) // batch_size
    for index in range(num_shards):
        shard = train.shard(index, num_shards)
        batches = list(shard.batches(batch_size, epoch=0, steps=steps))
        assert len(batches) == steps  # every worker makes exactly the same number of rounds
        assert all(x.shape == (batch_size, 1, 8, 8) and y.shape == (batch_size,) for x, y in batches)


def test_steps_per_epoch_uses_the_smallest_shard():
    # 10 samples over 3 shards: sizes 4, 3, 3 -> batches of 2: the small shards make 1 step, so everyone does
    assert steps_per_epoch(10, 3, 2) == 1
    assert [len(_toy(10).shard(i, 3)) // 2 for i in range(3)] == [2, 1, 1]


def test_steps_per_epoch_too_small():
    with pytest.raises(ValueError, match="cannot fill a batch of 64"):
        steps_per_epoch(100, 4, 64)


def test_batches_shuffle_per_epoch_and_drop_the_partial_batch():
    data = _toy(50)
    epoch0 = [y.tolist() for _, y in data.batches(8, epoch=0)]
    epoch0_again = [y.tolist() for _, y in data.batches(8, epoch=0)]
    epoch1 = [y.tolist() for _, y in data.batches(8, epoch=1)]
    assert len(epoch0) == 50 // 8
    assert epoch0 == epoch0_again and epoch0 != epoch1
    seen = [i for batch in epoch0 for i in batch]
    assert len(set(seen)) == len(seen) == 48  # no sample twice within an epoch
    assert len(list(data.batches(8, epoch=0, steps=2))) == 2
    assert len(list(data.batches(8, epoch=0, steps=100))) == 6


def test_collective_parties_spread_a_large_tensor_over_their_ranks() -> None:
    """With collective parties of up to R ranks, a tensor of at least R x 8192 elements gets at least R slices
    (one per rank to own), even under slice_elems; smaller tensors and jobs without such parties are as before."""
    from geomx.core.sharding import SPREAD_MIN_ELEMS, ShardPlanner

    spread = ShardPlanner(1, 1 << 18, spread=4)
    assert [s.numel for s in spread.place(65_536, 4)] == [16_384] * 4
    assert len(spread.place(4 * SPREAD_MIN_ELEMS - 1, 4)) == 1  # too small to be worth four messages
    assert len(spread.place(1 << 20, 4)) == 4  # already cut by slice_elems
    assert [s.shard for s in ShardPlanner(2, 1 << 18, spread=3).place(65_536, 4)] == [0, 1, 0, 1]
    assert len(ShardPlanner(1, 1 << 18).place(65_536, 4)) == 1
    with pytest.raises(ValueError, match="spread"):
        ShardPlanner(1, 1 << 18, spread=0)
