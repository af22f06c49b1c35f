"""Blocking HFA's windowed global round (``geomx.algorithms.hfa.windows``), against a stub of the rank's WAN
rounds: the deltas sent are HFA's, each answer lands in the job model's range, no more than ``depth`` windows are
ever out, and a local round sends nothing. (Blocking HFA in collective parties equal to its simulation, through
real processes, is ``tests/integration/test_collective.py``.)"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from geomx.algorithms.hfa.rules import LocalFrequencyAggregation
from geomx.algorithms.hfa.windows import MIN_WINDOW, WindowedRounds
from geomx.collective.layout import OwnerLayout
from geomx.collective.owners import SliceOwners
from geomx.core.sharding import slice_plan

NUMELS = {0: 700, 1: 300, 2: 1200}  # slices of at most 100 elements (key 2: 12), dealt to 2 ranks
WEIGHT = 0.5


class StubRounds:
    """The rank's WAN rounds: each piece's answer is ``piece + 100``; counts the windows out at once."""

    def __init__(self) -> None:
        self.sent: dict[tuple[int, int], np.ndarray] = {}
        self.windows: list[list[tuple[int, int]]] = []
        self.out = 0
        self.most_out = 0

    def send(self, pieces: Sequence[tuple[Any, torch.Tensor]], priority: Sequence[int],
             kind: Any = "gradient") -> list[Any]:
        assert kind == "delta"
        self.windows.append([owned.id for owned, _ in pieces])
        for owned, piece in pieces:
            self.sent[owned.id] = piece.numpy().copy()
        self.out += 1
        self.most_out = max(self.most_out, self.out)
        return [None] * len(pieces)

    def land(self, pieces: Sequence[tuple[Any, torch.Tensor]], futures: Sequence[Any],
             bases: Sequence[torch.Tensor] | None = None) -> None:
        assert bases is not None and len(bases) == len(pieces)
        for _, piece in pieces:
            piece.add_(100.0)
        self.out -= 1


class StubBucket:
    """``WholePartyModel``'s part the windows use: the layout, the rank, and the share (recorded)."""

    def __init__(self, layout: OwnerLayout, rank: int) -> None:
        self.layout = layout
        self.group = SimpleNamespace(rank=rank)
        self.shared: list[list[tuple[int, int]]] = []

    def share(self, tensors: Sequence[torch.Tensor], only: Any = None, group: Any = None) -> None:
        self.shared.append([owned.id for share in self.layout.owned for owned in share if only is None or only(owned)])


def _layout_and_models() -> tuple[OwnerLayout, list[torch.Tensor], list[torch.Tensor]]:
    """NUMELS's slices dealt to 2 ranks; a model and a job's model, random."""
    owners = SliceOwners(2)
    for key, numel in NUMELS.items():
        owners.add(key, slice_plan(numel, 100), itemsize=4)
    return (OwnerLayout(owners, NUMELS), [torch.randn(numel) for numel in NUMELS.values()],
            [torch.randn(numel) for numel in NUMELS.values()])


def _setup(rank: int, k2: int = 1, window: int | None = 250, depth: int = 2):
    layout, model, job_model = _layout_and_models()
    rules = LocalFrequencyAggregation(k2=k2, party_weight=WEIGHT)
    bucket, stub = StubBucket(layout, rank), StubRounds()
    rounds = WindowedRounds(rules, stub, bucket, job_model, window=window, depth=depth)  # type: ignore[arg-type]
    return layout, model, job_model, bucket, stub, rounds


@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize("depth", [1, 2, 3])
def test_a_global_round_sends_hfas_deltas_in_windows_and_lands_the_answers_in_the_job_model(rank: int,
                                                                                            depth: int) -> None:
    layout, model, job_model, bucket, stub, rounds = _setup(rank, depth=depth)
    before = [tensor.clone() for tensor in job_model]
    assert rounds.run(model, 1, priority=[0, 0, 0])
    owned = layout.owned[rank]
    assert set(stub.sent) == {slice_.id for slice_ in owned}
    for slice_ in owned:
        expected = (model[slice_.key] - before[slice_.key])[slice_.start:slice_.stop].numpy() * WEIGHT
        np.testing.assert_allclose(stub.sent[slice_.id], expected, rtol=1e-6)
        np.testing.assert_allclose(job_model[slice_.key][slice_.start:slice_.stop].numpy(), expected + 100.0,
                                   rtol=1e-6)
    mine = {(slice_.key, index) for slice_ in owned for index in range(slice_.start, slice_.stop)}
    for key, tensor in enumerate(job_model):  # the other ranks' ranges come by the share, not from here
        others = [index for index in range(tensor.numel()) if (key, index) not in mine]
        assert torch.equal(tensor[others], before[key][others])
    sizes = {slice_.id: slice_.numel for slice_ in owned}
    assert [sid for window in stub.windows for sid in window] == [slice_.id for slice_ in owned], "in order"
    assert all(sum(sizes[sid] for sid in window) <= 250 for window in stub.windows)
    assert len(stub.windows) > depth, "the round needs more windows than are out at once"
    assert stub.most_out == depth and stub.out == 0
    assert len(rounds.free) == depth, "each buffer reused"
    assert bucket.shared == [[slice_.id for share in layout.owned for slice_ in share]]


def test_a_slice_larger_than_the_window_is_a_window_alone() -> None:
    _, _, _, _, _, rounds = _setup(0, window=150)
    owned = rounds.owned
    cut = list(rounds.windows(owned))
    assert [slice_ for window in cut for slice_ in window] == owned
    assert all(len(window) == 1 or sum(s.numel for s in window) <= 150 for window in cut)
    _, _, _, _, _, tiny = _setup(0, window=1)
    assert [len(window) for window in tiny.windows(tiny.owned)] == [1] * len(tiny.owned)
    assert tiny.size == max(slice_.numel for slice_ in tiny.owned), "a buffer holds the largest slice"


def test_a_small_models_round_goes_out_in_one_window_and_its_buffer_holds_only_what_the_rank_owns() -> None:
    """The default window is 1/32 of the model but at least MIN_WINDOW elements: a small model's owned slices are
    not held back behind answers (one window, one buffer the size of the rank's share)."""
    layout, model, _, _, stub, rounds = _setup(1, window=None, depth=1)
    owned = layout.owned[1]
    assert rounds.window == MIN_WINDOW and rounds.size == sum(slice_.numel for slice_ in owned)
    assert rounds.run(model, 1, priority=[0, 0, 0])
    assert stub.windows == [[slice_.id for slice_ in owned]]


def test_a_local_round_sends_nothing_and_shares_nothing() -> None:
    _, model, job_model, bucket, stub, rounds = _setup(0, k2=2)
    before = [tensor.clone() for tensor in job_model]
    assert not rounds.run(model, 1, priority=[0, 0, 0])
    assert stub.windows == [] and bucket.shared == []
    assert all(torch.equal(a, b) for a, b in zip(job_model, before, strict=True))
    assert rounds.run(model, 2, priority=[0, 0, 0]), "the second local round goes global"


def test_depth_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        _setup(0, depth=0)


def _trips(delay: int):
    from geomx.algorithms.hfa.trips import FragmentTrips

    layout, model, job_model = _layout_and_models()
    rules = LocalFrequencyAggregation(k2=2, party_weight=WEIGHT, fragments=2)  # fragment 0 at odd rounds, 1 at even
    rules.assign_fragments({owned.id: owned.numel for share in layout.owned for owned in share})
    stub = StubRounds()
    trips = FragmentTrips(rules, stub, StubBucket(layout, 0), job_model, delay=delay,  # type: ignore[arg-type]
                          group=SimpleNamespace(rank=0))  # type: ignore[arg-type]
    first = [owned for owned in trips.owned if rules.goes_global(owned.id, 1)]
    assert first and len(first) < len(trips.owned), "fragment 0 leaves at round 1, alone"
    return model, job_model, stub, trips, first


def _check(stub: StubRounds, leaving: Sequence[Any], model: Sequence[torch.Tensor], base: Sequence[torch.Tensor],
           job_model: Sequence[torch.Tensor]) -> None:
    """What left for each slice is HFA's delta of ``model`` from ``base``; its answer is in the job's model."""
    for owned in leaving:
        range_ = slice(owned.start, owned.stop)
        expected = (model[owned.key][range_] - base[owned.key][range_]).numpy() * WEIGHT
        np.testing.assert_allclose(stub.sent[owned.id], expected, rtol=1e-6)
        np.testing.assert_allclose(job_model[owned.key][range_].numpy(), expected + 100.0, rtol=1e-6)


def test_an_overlapped_fragment_leaves_with_the_values_of_its_round() -> None:
    """``FragmentTrips``: the leaving slices are copied on a thread while the rank goes on (it waits for the copy
    before its optimizer's step, ``copied``); what leaves is the model as it was at the round, and the answers land
    in the job's model."""
    model, job_model, stub, trips, first = _trips(delay=1)
    base, at_round = [t.clone() for t in job_model], [t.clone() for t in model]
    trips.land(1)
    trips.leave(model, 1, priority=[0, 0, 0])
    assert trips.copy is not None, "the copy is the thread's"
    trips.copied()
    for tensor in model:  # the next step changes the model
        tensor.add_(1.0)
    trips.land(2)
    _check(stub, first, at_round, base, job_model)
    trips.finish()


def test_a_fragment_that_lands_and_leaves_at_one_round_leaves_before_the_mix() -> None:
    """With ``delay`` = K2 the fragment landing at a round is the one leaving: ``leave`` waits for its copy itself,
    so the mix that follows (here: the model changed right after ``leave``) does not reach what leaves."""
    model, job_model, stub, trips, first = _trips(delay=2)
    for count in (1, 2):
        trips.land(count)
        trips.leave(model, count, priority=[0, 0, 0])
        trips.copied()
        for tensor in model:
            tensor.add_(1.0)
    trips.land(3)  # fragment 0's first round lands: its global model is the job's model's ranges now
    base, at_round = [t.clone() for t in job_model], [t.clone() for t in model]
    trips.leave(model, 3, priority=[0, 0, 0])  # and it leaves again, from the model before the mix
    assert trips.copy is None, "leave waited for the copy"
    for tensor in model:
        tensor.mul_(-3.0)  # the mix, at once
    trips.land(4)
    trips.land(5)
    _check(stub, first, at_round, base, job_model)
    trips.finish()


def test_the_job_model_is_read_between_a_trips_writes() -> None:
    """``FragmentTrips.reading``: while a trip writes the job model (its answers, then the share with the party)
    a reader waits, so it never sees a slice half written; it goes on once the share is done."""
    import threading

    model, _, _, trips, _ = _trips(delay=1)
    in_share, release, read = threading.Event(), threading.Event(), threading.Event()

    def share(tensors: Sequence[torch.Tensor], only: Any = None, group: Any = None) -> None:
        in_share.set()
        assert release.wait(30), "the test never released the share"

    trips.bucket.share = share  # type: ignore[method-assign]
    trips.land(1)
    trips.leave(model, 1, priority=[0, 0, 0])
    assert in_share.wait(30), "the trip never reached its share"

    def reader() -> None:
        with trips.reading() as held:
            assert held is trips.job_model
            read.set()

    thread = threading.Thread(target=reader)
    thread.start()
    assert not read.wait(0.3), "the job model was read while the trip was writing it"
    release.set()
    assert read.wait(30), "the reader never got the job model after the share"
    thread.join(30)
    trips.land(2)
    trips.finish()
