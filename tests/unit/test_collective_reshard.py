"""FSDP2 inside a collective party, without processes: the dim-0 shards as torch.chunk cuts them, owners that
prefer the rank holding a slice, the moves between shards and owners (an all-to-all simulated in the test), and
the shardings and plans refused by name."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import Replicate, Shard

from geomx.collective.fsdp import LocalShards, dim0_rows, sharding_refusal
from geomx.collective.layout import OwnerLayout
from geomx.collective.owners import SliceOwners
from geomx.collective.reshard import Reshard
from geomx.core.sharding import slice_plan

SHAPES = {0: (7, 5), 1: (7,), 2: (3, 64), 3: (1,), 4: (64, 9)}  # uneven rows; slices across shard boundaries


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("rows", [0, 1, 3, 7, 8])
def test_dim0_rows_are_torch_chunks(world_size: int, rows: int) -> None:
    chunks = torch.chunk(torch.arange(rows), world_size) if rows else ()
    held = [dim0_rows(rows, world_size, rank) for rank in range(world_size)]
    assert [high - low for low, high in held] == [len(c) for c in chunks] + [0] * (world_size - len(chunks))
    assert [low for low, high in held if high > low] == [int(c[0]) for c in chunks]


def _plan(world_size: int, slice_elems: int, prefer: bool = True) -> tuple[LocalShards, OwnerLayout]:
    shards = LocalShards.of_shapes(SHAPES, world_size)
    owners = SliceOwners(world_size)
    numels = {key: torch.Size(shape).numel() for key, shape in SHAPES.items()}
    owners.add_many([(key, slice_plan(numel, slice_elems), 4) for key, numel in numels.items()],
                    prefer=shards.holder if prefer else None)
    return shards, OwnerLayout(owners, numels)


def _all_to_all(outboxes: list[torch.Tensor], splits: list[list[int]]) -> list[torch.Tensor]:
    """What ``all_to_all_single`` delivers: rank d's inbox is every rank's section for d, rank by rank."""
    sections = [list(torch.split(box, sizes)) for box, sizes in zip(outboxes, splits, strict=True)]
    return [torch.cat([sections[source][target] for source in range(len(outboxes))])
            for target in range(len(outboxes))]


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("slice_elems", [4, 13, 1000])
def test_shards_reach_their_owners_and_come_back(world_size: int, slice_elems: int) -> None:
    """Each rank starts with its shards of one model; after the way to the owners every owned slice holds the
    model's values; the owners change them, and after the way back every shard holds the changed values."""
    shards, layout = _plan(world_size, slice_elems)
    model = {key: torch.randn(shape).reshape(-1) for key, shape in SHAPES.items()}
    plans = [Reshard(shards, layout, rank) for rank in range(world_size)]
    views = [[model[key][slice(*shards.held(key, rank))].clone() for key in SHAPES] for rank in range(world_size)]
    outboxes = []
    for plan, rank_views in zip(plans, views, strict=True):
        outboxes.append(torch.full((sum(plan.out_splits),), float("nan")))
        plan.pack_for_owners(rank_views, outboxes[-1])
    inboxes = _all_to_all(outboxes, [plan.out_splits for plan in plans])
    assert [len(box) for box in inboxes] == [sum(plan.in_splits) for plan in plans]
    chunks = [torch.full((layout.chunk_numel,), float("nan")) for _ in range(world_size)]
    for rank, plan in enumerate(plans):
        plan.land_at_owners(inboxes[rank], views[rank], chunks[rank])
        for owned, piece in layout.pieces(chunks[rank], rank):
            assert torch.equal(piece, model[owned.key][owned.start:owned.stop]), (rank, owned)
            piece.mul_(-2)  # the owner's answer
    for rank, plan in enumerate(plans):
        plan.pack_for_shards(chunks[rank], inboxes[rank])
    back = _all_to_all(inboxes, [plan.in_splits for plan in plans])
    for rank, plan in enumerate(plans):
        plan.land_in_shards(back[rank], chunks[rank], views[rank])
        for key, view in zip(SHAPES, views[rank], strict=True):
            assert torch.equal(view, -2 * model[key][slice(*shards.held(key, rank))]), (rank, key)


def test_owners_prefer_the_rank_holding_a_slice_so_only_boundary_slices_move() -> None:
    """Two ranks, 64-element slices: every slice inside one rank's shard is that rank's, and only the slices
    across a shard boundary cross (by halves); the owners stay balanced within a few slices."""
    shards, layout = _plan(2, 64)
    plan = Reshard(shards, layout, 0)
    for rank, share in enumerate(layout.owned):
        for owned in share:
            holder = shards.holder(owned.key, owned.start, owned.stop)
            assert holder in (None, rank), (owned, holder)
    crossing = {(m.key, m.start, m.stop, m.source, m.target) for m in plan.moves if m.source != m.target}
    # key 0: rows 0-3 on rank 0 = [0, 20); its slice [0, 35) crosses; key 4: rows 0-31 = [0, 288): [256, 320)
    assert (0, 20, 35, 1, 0) in crossing or (0, 0, 20, 0, 1) in crossing
    assert (4, 256, 288, 0, 1) in crossing or (4, 288, 320, 1, 0) in crossing
    moved = sum(m.numel for m in plan.moves if m.source != m.target)
    assert moved <= 4 * 64, moved  # a slice per boundary at most
    assert layout.owned_numel[0] == pytest.approx(layout.owned_numel[1], abs=2 * 64)
    unpreferred = Reshard(*_plan(2, 64, prefer=False), 0)
    assert sum(m.numel for m in unpreferred.moves if m.source != m.target) > moved


def test_plans_where_nothing_crosses_a_rank_need_no_collective() -> None:
    shards, layout = _plan(1, 10)
    plan = Reshard(shards, layout, 0)
    assert not plan.crosses and plan.outgoing == plan.incoming == [] and plan.out_splits == [0]


def test_a_sharding_geomx_cannot_sync_is_refused_naming_the_parameter() -> None:
    assert sharding_refusal("w", [Shard(0)], [0, 1], 2) is None
    assert "placed (Shard(dim=1),)" in sharding_refusal("fc.weight", [Shard(1)], [0, 1], 2)
    assert "'fc.weight'" in sharding_refusal("fc.weight", [Replicate()], [0, 1], 2)
    assert "2-D device mesh (HSDP" in sharding_refusal("w", [Replicate(), Shard(0)], [[0, 1], [2, 3]], 4)
    assert "sharded over ranks [0]" in sharding_refusal("w", [Shard(0)], [0], 2)
