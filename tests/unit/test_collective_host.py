"""A rank's owned chunk on the host (``geomx.collective.host``): the GPU's path (a second buffer, one copy each
way) walked on the CPU, and the CPU's (the chunk itself, no copy)."""

from __future__ import annotations

import pytest
import torch

from geomx.collective.host import HostChunk
from geomx.collective.layout import OwnerLayout
from geomx.collective.owners import OwnedSlice, SliceOwners
from geomx.core.sharding import slice_plan


def _layout() -> OwnerLayout:
    owners = SliceOwners(2)
    for key, numel in enumerate([700, 300, 1200]):
        owners.add(key, slice_plan(numel, 500), itemsize=4)
    return OwnerLayout(owners, {0: 700, 1: 300, 2: 1200})


@pytest.mark.parametrize("rank", [0, 1])
def test_a_copied_host_chunk_moves_the_whole_chunk_down_and_the_answers_up(rank: int) -> None:
    layout = _layout()
    chunk = torch.arange(layout.chunk_numel, dtype=torch.float32)
    pieces = list(layout.pieces(chunk, rank))
    stage = HostChunk(chunk, pieces, copy=True)
    assert stage.host.data_ptr() != chunk.data_ptr()
    assert [owned for owned, _ in stage.pieces] == [owned for owned, _ in pieces]
    stage.down()
    for (_, host), (_, device) in zip(stage.pieces, pieces, strict=True):
        assert torch.equal(host, device)  # each host view sits at its device piece's offset
    for number, (_, host) in enumerate(stage.pieces):
        host.fill_(-number - 1.0)  # the answers, written on the host
    assert chunk[0] == 0, "nothing reaches the chunk before up"
    stage.up()
    for number, (_, device) in enumerate(pieces):
        assert torch.all(device == -number - 1.0)


def test_on_the_cpu_the_host_chunk_is_the_chunk() -> None:
    layout = _layout()
    chunk = torch.zeros(layout.chunk_numel)
    stage = HostChunk(chunk, list(layout.pieces(chunk, 0)))
    assert stage.host is chunk
    stage.pieces[0][1].fill_(7.0)
    stage.up()
    stage.down()
    assert chunk[0] == 7.0


def test_a_piece_outside_the_chunk_is_refused_by_name() -> None:
    chunk = torch.zeros(10)
    stray = (OwnedSlice(key=3, index=1, num_slices=2, start=0, stop=4), torch.zeros(4))
    with pytest.raises(ValueError, match="key 3 slice 1"):
        HostChunk(chunk, [stray], copy=True)
