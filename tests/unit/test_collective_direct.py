"""``PartyGroup``'s direct path on gloo (all-gathers and reduce-scatters rank to rank, ``isend`` / ``irecv``, one
tag per call) between real processes: a reduce-scatter is exactly the rank-order sum, an all-gather exactly every
rank's chunk, calls in flight together stay apart, the results match gloo's own collectives, and a dead peer or a
wrong size fails by the party's name. ``WholePartyModel.share`` (each owner's slices straight from its tensors to the
other ranks') brings exactly the chosen slices, as the chunk and an all-gather would. The direct path replaces
gloo's collectives for speed, so it must give the same answers, and fail the same way, on sizes that no vector
width divides."""

from __future__ import annotations

import datetime
import multiprocessing
import os
import queue
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

N = 1001  # elements per rank's part
REDUCED = ("reduce-scatter", "reduce-scatter async", "reduce-scatter in place", "lanes")


def _inputs(rank: int, world: int) -> list[torch.Tensor]:
    """Rank ``rank``'s two reduce-scatter buffers, then its two all-gather chunks."""
    generator = torch.Generator().manual_seed(100 + rank)
    return [torch.randn(world * N, generator=generator) for _ in range(2)] + \
        [torch.randn(N, generator=generator) for _ in range(2)]


def _collectives(group: Any, rank: int, world: int) -> dict[str, list[torch.Tensor]]:
    """Every collective under test, once, on this rank; results keyed as ``_expected``'s."""
    a, b, c, d = _inputs(rank, world)
    chunks = [torch.full((N,), float("nan")) for _ in range(2)]
    buffers = [torch.full((world * N,), float("nan")) for _ in range(2)]
    group.reduce_scatter(chunks[0], a.clone())
    got = {"reduce-scatter": [chunks[0].clone()]}
    sent = [a.clone(), b.clone()]  # both in flight before either is waited; waited last first
    pending = [group.reduce_scatter_async(chunks[0], sent[0]), group.reduce_scatter_async(chunks[1], sent[1])]
    for work in reversed(pending):
        work.wait()
    got["reduce-scatter async"] = [chunk.clone() for chunk in chunks]
    inplace = a.clone()  # the sums land in this rank's own part of the buffer (FSA's per-step path)
    group.reduce_scatter(inplace[rank * N:(rank + 1) * N], inplace)
    got["reduce-scatter in place"] = [inplace[rank * N:(rank + 1) * N].clone()]
    group.all_gather(buffers[0], c)
    got["all-gather"] = [buffers[0].clone()]
    inplace = torch.full((world * N,), float("nan"))
    inplace[rank * N:(rank + 1) * N] = c
    group.all_gather(inplace, inplace[rank * N:(rank + 1) * N])  # the chunk already in its part
    got["all-gather in place"] = [inplace]
    buffers = [torch.full((world * N,), float("nan")) for _ in range(2)]
    pending = [group.all_gather_async(buffers[0], c), group.all_gather_async(buffers[1], d)]
    for work in reversed(pending):
        work.wait()
    got["all-gather async"] = buffers
    # two lanes: rank 0 starts an all-gather of the answers' lane before a reduce-scatter, the others after it
    # (FSA lands a bucket's answers whenever they are in); each lane's tags keep the pairs apart. gloo's own
    # collectives have no lanes: there every rank keeps one order
    chunk, buffer = torch.full((N,), float("nan")), torch.full((world * N,), float("nan"))
    scatter = lambda: group.reduce_scatter_async(chunk, a.clone())  # noqa: E731
    gather = lambda: group.all_gather_async(buffer, d, lane="answers")  # noqa: E731
    pending = [gather(), scatter()] if rank == 0 and group.direct else [scatter(), gather()]
    for work in pending:
        work.wait()
    got["lanes"] = [chunk, buffer]
    return got


def _expected(rank: int, world: int) -> dict[str, list[torch.Tensor]]:
    """What ``_collectives`` must give rank ``rank``, from every rank's inputs drawn again here."""
    inputs = [_inputs(r, world) for r in range(world)]

    def summed(which: int) -> torch.Tensor:  # rank 0's part + rank 1's + ..., as the direct path adds
        terms = [mine[which][rank * N:(rank + 1) * N] for mine in inputs]
        total = terms[0] + terms[1]
        for term in terms[2:]:
            total += term
        return total

    def gathered(which: int) -> torch.Tensor:
        return torch.cat([mine[which] for mine in inputs])

    return {"reduce-scatter": [summed(0)], "reduce-scatter async": [summed(0), summed(1)],
            "reduce-scatter in place": [summed(0)],
            "all-gather": [gathered(2)], "all-gather in place": [gathered(2)],
            "all-gather async": [gathered(2), gathered(3)], "lanes": [summed(0), gathered(3)]}


def _join(rank: int, world: int, store: str, timeout_s: float) -> Any:
    import torch.distributed as dist

    from geomx.collective.group import PartyGroup

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))
    group = PartyGroup("dc1", rank, world)
    assert group.direct, "gloo's group should take the direct path"
    return group


def _exit(out: multiprocessing.Queue) -> None:
    out.close()
    out.join_thread()  # what was put is in the pipe
    os._exit(0)  # no interpreter teardown: gloo's threads can abort it (see test_collective_layout)


def _exchanging_rank(rank: int, world: int, store: str, out: multiprocessing.Queue) -> None:
    group = _join(rank, world, store, timeout_s=30)
    try:
        got: dict[bool, Any] = {}
        for direct in (True, False):  # the direct path, then gloo's own collectives
            group.direct = direct
            got[direct] = {k: [t.numpy().copy() for t in v] for k, v in _collectives(group, rank, world).items()}
        out.put((rank, (got, _shares(group, rank, world))))  # numpy travels by value (a tensor would be a handle)
    except Exception:
        out.put((rank, traceback.format_exc()))
    group.barrier()
    _exit(out)


def _dying_peer(rank: int, world: int, store: str, out: multiprocessing.Queue) -> None:
    from geomx.collective.group import PartyError

    group = _join(rank, world, store, timeout_s=5)
    group.barrier()
    if rank == 1:
        os._exit(3)  # a rank dies between two collectives
    started = time.monotonic()
    try:
        group.all_gather(torch.empty(world * N), torch.ones(N))
        out.put(("no error", time.monotonic() - started))
    except PartyError as error:
        out.put((str(error), time.monotonic() - started))
    _exit(out)


def _wrong_sizes(rank: int, world: int, store: str, out: multiprocessing.Queue) -> None:
    from geomx.collective.group import PartyError

    group = _join(rank, world, store, timeout_s=30)
    texts = []
    for call in (lambda: group.all_gather(torch.zeros(10), torch.zeros(3)),
                 lambda: group.reduce_scatter(torch.zeros(3), torch.zeros(10))):
        try:
            call()
            texts.append("no error")
        except PartyError as error:
            texts.append(str(error))
    chunk, buffer = torch.zeros(N), torch.randn(N)
    group.reduce_scatter(chunk, buffer)  # a party of one: its own part, on the same path
    gathered = torch.zeros(N)
    group.all_gather(gathered, chunk)
    out.put((texts, torch.equal(chunk, buffer) and torch.equal(gathered, buffer)))
    _exit(out)


def _spawn(target: Callable[..., None], world: int, answers: int) -> list[Any]:
    context = multiprocessing.get_context("spawn")
    results: multiprocessing.Queue = context.Queue()
    with tempfile.TemporaryDirectory() as folder:
        store = str(Path(folder) / "store")
        procs = [context.Process(target=target, args=(r, world, store, results), daemon=True) for r in range(world)]
        for proc in procs:
            proc.start()
        try:
            return [results.get(timeout=120) for _ in range(answers)]
        except queue.Empty:
            pytest.fail(f"no answer within 120 s from {target.__name__}")
        finally:
            for proc in procs:
                proc.join(timeout=60)
                if proc.is_alive():
                    proc.kill()


@pytest.fixture(scope="module", params=[2, 3], ids=["world2", "world3"])
def exchanged(request: pytest.FixtureRequest) -> tuple[int, dict[int, Any]]:
    """One party of ``world`` ranks running every exchange under test once (spawned once for the module's tests):
    the world size and each rank's answers (or its traceback)."""
    return request.param, dict(_spawn(_exchanging_rank, request.param, answers=request.param))


def test_direct_collectives_are_exact_keep_concurrent_calls_apart_and_match_gloos_own(
        exchanged: tuple[int, dict[int, Any]]) -> None:
    world, answers = exchanged
    for rank in range(world):
        assert not isinstance(answers[rank], str), f"rank {rank} failed:\n{answers[rank]}"
        got = answers[rank][0]
        direct, native = got[True], got[False]
        for name, want in _expected(rank, world).items():
            assert len(direct[name]) == len(want), name
            for index, (a, b, w) in enumerate(zip(direct[name], native[name], want, strict=True)):
                a, b = torch.from_numpy(a), torch.from_numpy(b)
                assert torch.equal(a, w), f"rank {rank}'s direct {name} #{index} is not the rank-order result"
                if name in REDUCED:  # gloo sums in an order of its own
                    torch.testing.assert_close(b, a, msg=lambda m, r=rank, n=name: f"rank {r}'s gloo {n}: {m}")
                else:
                    assert torch.equal(b, a), f"rank {rank}'s gloo {name} #{index} differs from the direct one"


def test_a_dead_peer_fails_the_direct_all_gather_by_name_within_the_timeout() -> None:
    [(text, seconds)] = _spawn(_dying_peer, 2, answers=1)
    assert text.startswith("party dc1: rank 0's all-gather failed"), text
    assert seconds < 30, seconds  # the group's timeout (5 s) bounds it; never a hang


def test_a_wrong_size_is_refused_naming_the_sizes() -> None:
    [(texts, alone_ok)] = _spawn(_wrong_sizes, 1, answers=1)
    assert texts == ["party dc1: rank 0's all-gather needs 1 x 3 elements, got 10",
                     "party dc1: rank 0's reduce-scatter needs 1 x 3 elements, got 10"]
    assert alone_ok  # and the right sizes pass, a party of one


SHARE_KEYS = {0: 900, 1: 37, 2: 2500}  # elements of each key: a slice per 300, the last short ones odd


def _share_layout(world: int) -> Any:
    from geomx.collective.layout import OwnerLayout
    from geomx.collective.owners import SliceOwners

    owners = SliceOwners(world)
    # key 2's slices go in runs of adjacent slices to each rank (as FSDP2's shards place them): one message a run
    prefer = lambda key, start, stop: start * world // SHARE_KEYS[key] if key == 2 else None  # noqa: E731
    owners.add_many([(key, [(s, min(s + 300, n)) for s in range(0, n, 300)], 4) for key, n in SHARE_KEYS.items()],
                    prefer=prefer)
    return OwnerLayout(owners, SHARE_KEYS)


def _owner_values(key: int, start: int, stop: int) -> torch.Tensor:
    return torch.arange(start, stop, dtype=torch.float32) + 10_000 * key


def _shares(group: Any, rank: int, world: int) -> tuple[dict[bool, list[Any]], list[Any]]:
    """``WholePartyModel.share`` rank to rank and through the chunk; then two ``send_recv_async`` in flight at once
    around a ring, waited last first: (each path's tensors, the ring's two receipts)."""
    from geomx.collective.party_model import WholePartyModel

    layout = _share_layout(world)
    chosen = lambda owned: owned.key != 1 and owned.index != 1  # noqa: E731 (a streaming fragment, say)
    got = {}
    for direct in (True, False):  # rank to rank, then through the chunk and gloo's all-gather
        group.direct = direct
        tensors = [torch.full((n,), float("nan")) for n in SHARE_KEYS.values()]
        for owned in layout.owned[rank]:  # the owner's values, where it wrote its answers
            tensors[owned.key][owned.start:owned.stop] = _owner_values(owned.key, owned.start, owned.stop)
        WholePartyModel(layout, group, like=tensors[0]).share(tensors, only=chosen)
        got[direct] = [t.numpy().copy() for t in tensors]
    group.direct = True
    a, b = torch.full((5,), float(rank)), torch.full((7,), float(rank) + 0.5)
    peer, source = (rank + 1) % world, (rank - 1) % world
    into = [torch.zeros(5), torch.zeros(7)]
    first = group.send_recv_async("first", 1, [(peer, 0, a)], [(source, 0, into[0])])
    second = group.send_recv_async("second", 1, [(peer, 0, b)], [(source, 0, into[1])])
    second.wait()
    first.wait()
    return got, [t.numpy().copy() for t in into]


def test_share_brings_every_rank_each_owners_chosen_slices_and_nothing_else(
        exchanged: tuple[int, dict[int, Any]]) -> None:
    """``WholePartyModel.share``, rank to rank: each chosen slice equals its owner's on every rank; a slice not
    chosen keeps what the rank held (its own, or NaN); the same as through the chunk and an all-gather."""
    world, answers = exchanged
    layout = _share_layout(world)
    for rank in range(world):
        assert not isinstance(answers[rank], str), f"rank {rank} failed:\n{answers[rank]}"
        got, ring = answers[rank][1]
        for share in layout.owned:
            for owned in share:
                for direct in (True, False):
                    held = torch.from_numpy(got[direct][owned.key][owned.start:owned.stop])
                    if (owned.key != 1 and owned.index != 1) or owned in layout.owned[rank]:
                        want = _owner_values(owned.key, owned.start, owned.stop)
                        assert torch.equal(held, want), f"rank {rank} key {owned.key} slice {owned.index} {direct}"
                    elif direct:  # the chunk's path may move more than it is asked to (its windows)
                        assert torch.isnan(held).all(), f"rank {rank} got key {owned.key} slice {owned.index}"
        left = (rank - 1) % world
        assert ring[0].tolist() == [float(left)] * 5 and ring[1].tolist() == [left + 0.5] * 7, ring
