"""The collective tier's pure pieces: who owns each slice, and the owner-ordered buffer that one reduce-scatter
and one all-gather move; then the same two collectives for real, over gloo between two processes."""

from __future__ import annotations

import multiprocessing
import os
import tempfile
from pathlib import Path

import pytest
import torch

from geomx.collective.layout import OwnerLayout
from geomx.collective.owners import SliceOwners
from geomx.core.sharding import slice_plan


def _owners(numels: list[int], world_size: int, slice_elems: int) -> SliceOwners:
    owners = SliceOwners(world_size)
    for key, numel in enumerate(numels):
        owners.add(key, slice_plan(numel, slice_elems), itemsize=4)
    return owners


def test_owners_balance_bytes_greedily_in_declaration_order() -> None:
    owners = _owners([1000, 1000, 10, 2000], world_size=2, slice_elems=1000)  # one key at a time
    # slices: k0 [0,1000) -> r0; k1 [0,1000) -> r1; k2 -> r0 (1000 vs 1000 ties low); k3 s0 -> r1, k3 s1 -> r0
    assert [owners.owner(0, 0), owners.owner(1, 0), owners.owner(2, 0), owners.owner(3, 0), owners.owner(3, 1)] \
        == [0, 1, 0, 1, 0]
    assert [s.id for s in owners.owned(0)] == [(0, 0), (2, 0), (3, 1)]
    assert owners.loads == [4 * 2010, 4 * 2000]
    assert owners.imbalance() < 1.01


def test_keys_declared_together_go_largest_first_and_a_weightless_key_only_gets_owners() -> None:
    owners = SliceOwners(2)
    owners.add_many([(9, [(0, 50)], 0), (0, [(0, 10)], 4), (1, [(0, 300), (300, 400)], 4), (2, [(0, 200)], 4)])
    # largest first: (1,0) 1200 B -> r0, (2,0) 800 -> r1, (1,1) 400 -> r1, (0,0) 40 -> r0 (a tie), (9,0) 0 -> r1
    assert owners.loads == [1240, 1200]
    assert [s.id for s in owners.owned(0)] == [(0, 0), (1, 0)]  # each rank's in declaration order
    assert [s.id for s in owners.owned(1)] == [(9, 0), (1, 1), (2, 0)]


def test_owners_refuse_what_they_do_not_know() -> None:
    owners = _owners([10], world_size=2, slice_elems=100)
    with pytest.raises(KeyError, match="key 5 slice 0 was never declared"):
        owners.owner(5, 0)
    with pytest.raises(ValueError, match="already declared"):
        owners.add(0, [(0, 10)], 4)
    with pytest.raises(ValueError, match="rank 2 is not in a party of 2"):
        owners.owned(2)
    with pytest.raises(ValueError, match="at least one rank"):
        SliceOwners(0)


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_layout_packs_every_element_once_and_unpacks_it_back(world_size: int) -> None:
    shapes = [(7, 5), (300,), (1,), (64, 9)]
    tensors = [torch.randn(s) for s in shapes]
    layout = OwnerLayout(_owners([t.numel() for t in tensors], world_size, slice_elems=100),
                         dict(enumerate(t.numel() for t in tensors)))
    buffer = layout.empty(torch.float32, "cpu")
    layout.pack(tensors, buffer)
    assert sorted(buffer.tolist()) == sorted([0.0] * (layout.numel - sum(layout.owned_numel))
                                             + torch.cat([t.view(-1) for t in tensors]).tolist())
    for rank in range(world_size):  # a rank's pieces are its owned slices, views into its chunk
        for owned, piece in layout.pieces(layout.chunk(buffer, rank), rank):
            assert torch.equal(piece, tensors[owned.key].view(-1)[owned.start:owned.stop])
    out = [torch.zeros(s) for s in shapes]
    layout.unpack(buffer, out)
    assert all(torch.equal(a, b) for a, b in zip(out, tensors, strict=True))


def test_layout_refuses_mismatched_tensors() -> None:
    layout = OwnerLayout(_owners([10, 20], 2, slice_elems=8), {0: 10, 1: 20})
    buffer = layout.empty(torch.float32, "cpu")
    with pytest.raises(ValueError, match="key 1 has 21 elements; the layout says 20"):
        layout.pack([torch.zeros(10), torch.zeros(21)], buffer)
    with pytest.raises(ValueError, match="expected 2 tensors"):
        layout.pack([torch.zeros(10)], buffer)
    with pytest.raises(ValueError, match=r"declare no slices of keys \[2\]"):
        OwnerLayout(_owners([10, 20], 2, slice_elems=8), {0: 10, 1: 20, 2: 5})
    only = OwnerLayout(_owners([10, 20], 2, slice_elems=8), {1: 20})  # another key of the owners stays out
    assert only.numel == 2 * max(only.owned_numel) and sum(only.owned_numel) == 20


def _rank(rank: int, store: str, shapes: list[tuple[int, ...]], out: multiprocessing.Queue) -> None:
    import torch.distributed as dist

    from geomx.collective.group import PartyGroup

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        group = PartyGroup.join(None, party="dc1", timeout_s=30, backend="gloo")
        generator = torch.Generator().manual_seed(rank)
        tensors = [torch.randn(s, generator=generator) for s in shapes]
        layout = OwnerLayout(_owners([t.numel() for t in tensors], 2, slice_elems=50),
                             dict(enumerate(t.numel() for t in tensors)))
        buffer = layout.empty(torch.float32, "cpu")
        layout.pack(tensors, buffer)
        chunk = torch.empty(layout.chunk_numel)
        group.reduce_scatter(chunk, buffer)
        mine = {owned.id: piece.numpy().copy() for owned, piece in layout.pieces(chunk, rank)}
        group.all_gather(buffer, chunk)
        summed = [torch.empty(s) for s in shapes]
        layout.unpack(buffer, summed)
        # numpy travels by value: a tensor through a queue is a shared-memory handle, gone once this process exits
        out.put((rank, mine, [t.numpy().copy() for t in summed]))
    finally:
        dist.barrier()  # then exit: destroy_process_group can hang in gloo after the last collective
    # and exit without the interpreter's teardown: gloo's threads of a group never destroyed can abort it
    # ("terminate called without an active exception", seen once in CI) after the test's work is done
    out.close()
    out.join_thread()  # what was put is in the pipe
    os._exit(0)


def test_reduce_scatter_then_all_gather_equal_the_single_process_sum() -> None:
    shapes = [(7, 5), (120,), (3,), (11, 9)]
    context = multiprocessing.get_context("spawn")
    results: multiprocessing.Queue = context.Queue()
    with tempfile.TemporaryDirectory() as folder:
        store = str(Path(folder) / "store")
        procs = [context.Process(target=_rank, args=(r, store, shapes, results)) for r in range(2)]
        for proc in procs:
            proc.start()
        got = {rank: ({sid: torch.from_numpy(a) for sid, a in mine.items()}, [torch.from_numpy(a) for a in summed])
           for rank, mine, summed in (results.get(timeout=120) for _ in procs)}
        for proc in procs:
            proc.join(timeout=60)
            assert proc.exitcode == 0
    drawn = []
    for r in range(2):
        generator = torch.Generator().manual_seed(r)
        drawn.append([torch.randn(s, generator=generator) for s in shapes])
    reference = [a + b for a, b in zip(drawn[0], drawn[1], strict=True)]
    owners = _owners([torch.Size(s).numel() for s in shapes], 2, slice_elems=50)
    for rank, (mine, summed) in got.items():
        assert set(mine) == {s.id for s in owners.owned(rank)}  # each rank got its own slices' sums
        for (key, index), piece in mine.items():
            owned = next(s for s in owners.owned(rank) if s.id == (key, index))
            torch.testing.assert_close(piece, reference[key].view(-1)[owned.start:owned.stop])
        for a, b in zip(summed, reference, strict=True):
            torch.testing.assert_close(a, b)


def _dying_peer(rank: int, store: str, out: multiprocessing.Queue) -> None:
    import os
    import time

    import torch.distributed as dist

    from geomx.collective.group import PartyError, PartyGroup

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2,
                            timeout=__import__("datetime").timedelta(seconds=5))
    group = PartyGroup("dc1", rank, 2)
    group.barrier()
    if rank == 1:
        os._exit(3)  # a rank dies between two collectives
    started = time.monotonic()
    try:
        group.all_reduce(torch.ones(4))
        out.put(("no error", time.monotonic() - started))
    except PartyError as error:
        out.put((str(error), time.monotonic() - started))


def test_a_dead_rank_fails_the_partys_next_collective_by_name_within_the_timeout() -> None:
    context = multiprocessing.get_context("spawn")
    results: multiprocessing.Queue = context.Queue()
    with tempfile.TemporaryDirectory() as folder:
        store = str(Path(folder) / "store")
        procs = [context.Process(target=_dying_peer, args=(r, store, results)) for r in range(2)]
        for proc in procs:
            proc.start()
        text, seconds = results.get(timeout=120)
        for proc in procs:
            proc.join(timeout=60)
    assert text.startswith("party dc1: rank 0's all-reduce failed"), text
    assert seconds < 30, seconds  # the group's timeout (5 s) bounds it; never a hang


def test_backward_buckets_go_deepest_first_and_cut_by_bytes() -> None:
    from geomx.collective.party_model import backward_buckets

    numels = {0: 100, 1: 10, 2: 300, 3: 5}
    assert backward_buckets(numels, 4, bucket_bytes=1 << 20) == [[3, 2, 1, 0]]
    assert backward_buckets(numels, 4, bucket_bytes=1300) == [[3, 2, 1], [0]]  # 1260 bytes, then 400
    assert backward_buckets(numels, 4, bucket_bytes=4) == [[3], [2], [1], [0]]  # a key larger than a bucket alone


def test_a_bucket_of_a_model_mixing_dtypes_is_kept_in_the_widest() -> None:
    from geomx.collective.party_model import bucket_like

    weights, norm = torch.zeros(3, dtype=torch.bfloat16), torch.zeros(2)
    assert bucket_like([weights, weights]).dtype == torch.bfloat16  # as DDP all-reduces a bfloat16 model
    assert bucket_like([weights, norm]).dtype == torch.float32 == bucket_like([norm, weights]).dtype
    assert bucket_like([weights]).numel() == 0 and bucket_like([weights]).device == weights.device


def test_pack_key_puts_one_tensor_where_pack_puts_it() -> None:
    tensors = [torch.randn(7, 5), torch.randn(300), torch.randn(3)]
    layout = OwnerLayout(_owners([t.numel() for t in tensors], 2, slice_elems=100),
                         dict(enumerate(t.numel() for t in tensors)))
    whole, one_by_one = layout.empty(torch.float32, "cpu"), layout.empty(torch.float32, "cpu")
    layout.pack(tensors, whole)
    for key in (2, 0, 1):  # in any order, as gradients arrive
        layout.pack_key(key, tensors[key], one_by_one)
    assert torch.equal(whole, one_by_one)


class _LockstepGroup:
    """An in-process stand-in for a party's group: the n-th ``all_gather`` sees what every rank gave to its n-th so
    far (zeros for a rank that has not called yet), so the last rank to call gets the real result."""

    def __init__(self, rank: int, world_size: int, given: dict[tuple[int, int], torch.Tensor]) -> None:
        self.rank, self.world_size, self.given, self.calls = rank, world_size, given, 0

    def all_gather(self, out: torch.Tensor, mine: torch.Tensor) -> None:
        self.given[(self.rank, self.calls)] = mine.clone()
        out.copy_(torch.cat([self.given.get((r, self.calls), torch.zeros_like(mine)) for r in range(self.world_size)]))
        self.calls += 1


@pytest.mark.parametrize("window", [1 << 23, 37])  # one all-gather, or many that cut slices
@pytest.mark.parametrize("partial", [False, True])
def test_a_spread_moves_every_owners_chosen_slices_and_only_those(monkeypatch, window: int, partial: bool) -> None:
    """``WholePartyModel.spread`` (``only=``: a streaming fragment): the chosen slices of every owner land, the others
    stay; in windows of any size."""
    from geomx.collective import party_model as party_model_module

    monkeypatch.setattr(party_model_module, "SPREAD_WINDOW", window)
    numels = [300, 50, 420]
    layout = OwnerLayout(_owners(numels, 2, slice_elems=100), dict(enumerate(numels)))
    given: dict[tuple[int, int], torch.Tensor] = {}
    buckets = [party_model_module.WholePartyModel(layout, _LockstepGroup(r, 2, given), like=torch.zeros(1))
               for r in (1, 0)]
    for bucket in buckets:  # each owner's chunk: its slices' values, 1000 * rank + position
        bucket.own([torch.arange(n, dtype=torch.float32) + 1000 * bucket.group.rank for n in numels])

    def only(owned) -> bool:  # type: ignore[no-untyped-def]
        return not partial or owned.index % 2 == 0  # every other slice of each key

    for bucket in buckets:  # rank 1 first, then rank 0 (which then sees both)
        out = [torch.full((n,), -1.0) for n in numels]
        bucket.spread(out, only=only if partial else None)
    for rank in (0, 1):
        for owned in layout.owned[rank]:
            got = out[owned.key][owned.start:owned.stop]
            want = (torch.arange(owned.start, owned.stop, dtype=torch.float32) + 1000 * rank if only(owned)
                    else torch.full((owned.numel,), -1.0))
            assert torch.equal(got, want), (owned, rank)
