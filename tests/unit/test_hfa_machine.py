"""The round machine (``geomx.algorithms.hfa.machine``) against a stub of the rank's WAN rounds, through each CPU
host mirror: the deltas sent are HFA's, each answer lands in the job model's range, no more than ``depth`` windows
are ever out, a local round sends nothing, an overlapped slice leaves with its round's values, and the staged
mirror (the GPU's shape of the path) sends and lands exactly what the in-place one does. (HFA in collective
parties equal to its simulation, through real processes, is ``tests/integration/test_collective.py``.)"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from geomx.algorithms.hfa.machine import MIN_WINDOW, RoundMachine
from geomx.algorithms.hfa.rules import LocalFrequencyAggregation
from geomx.collective.layout import OwnerLayout
from geomx.collective.mirror import InPlaceMirror, StagedMirror
from geomx.collective.owners import SliceOwners
from geomx.core.sharding import slice_plan

NUMELS = {0: 700, 1: 300, 2: 1200}  # slices of at most 100 elements (key 2: 12), dealt to 2 ranks
WEIGHT = 0.5
MIRRORS = {"in_place": InPlaceMirror, "staged": StagedMirror}


class StubRounds:
    """The rank's WAN rounds: each piece's answer is ``piece + 100``; counts the windows out at once."""

    def __init__(self) -> None:
        self.sent: dict[tuple[int, int], np.ndarray] = {}
        self.history: list[tuple[tuple[int, int], np.ndarray]] = []  # every slice sent, in order
        self.windows: list[list[tuple[int, int]]] = []
        self.tokens: list[Any] = []  # each send's tokens (decoupled rounds)
        self.out = 0
        self.most_out = 0

    def send(self, pieces: Sequence[tuple[Any, torch.Tensor]], priority: Sequence[int],
             kind: Any = "gradient", tokens: Any = None) -> list[Any]:
        assert kind == "delta"
        self.tokens.append(tokens)
        self.windows.append([owned.id for owned, _ in pieces])
        for owned, piece in pieces:
            self.sent[owned.id] = piece.numpy().copy()
            self.history.append((owned.id, self.sent[owned.id]))
        self.out += 1
        self.most_out = max(self.most_out, self.out)
        return [None] * len(pieces)

    def land(self, pieces: Sequence[tuple[Any, torch.Tensor]], futures: Sequence[Any],
             bases: Sequence[torch.Tensor] | None = None) -> None:
        assert bases is not None and len(bases) == len(pieces)
        for _, piece in pieces:
            piece.add_(100.0)
        self.out -= 1


class StubModel:
    """``WholePartyModel``'s part the machine uses: the layout, the rank, and the share (recorded)."""

    whole = True

    def __init__(self, layout: OwnerLayout, rank: int) -> None:
        self.layout = layout
        self.group = SimpleNamespace(rank=rank)
        self.shared: list[list[tuple[int, int]]] = []

    def share(self, tensors: Sequence[torch.Tensor], only: Any = None, group: Any = None) -> None:
        self.shared.append([owned.id for share in self.layout.owned for owned in share if only is None or only(owned)])


def _layout_and_models(seed: int = 0) -> tuple[OwnerLayout, list[torch.Tensor], list[torch.Tensor]]:
    """NUMELS's slices dealt to 2 ranks; a model and a job's model, random."""
    owners = SliceOwners(2)
    for key, numel in NUMELS.items():
        owners.add(key, slice_plan(numel, 100), itemsize=4)
    generator = torch.Generator().manual_seed(seed)
    return (OwnerLayout(owners, NUMELS), [torch.randn(numel, generator=generator) for numel in NUMELS.values()],
            [torch.randn(numel, generator=generator) for numel in NUMELS.values()])


def _setup(rank: int, k2: int = 1, window: int | None = 250, depth: int = 2, mirror: str = "in_place"):
    layout, model, job_model = _layout_and_models()
    rules = LocalFrequencyAggregation(k2=k2, party_weight=WEIGHT)
    bucket, stub = StubModel(layout, rank), StubRounds()
    machine = RoundMachine(rules, stub, bucket, job_model, MIRRORS[mirror](), window=window,  # type: ignore[arg-type]
                           depth=depth)
    return layout, model, job_model, bucket, stub, machine


def _blocking_round(machine: RoundMachine, model: list[torch.Tensor], count: int) -> bool:
    machine.leave(model, count, priority=[0, 0, 0])
    return machine.land(count)


@pytest.mark.parametrize("mirror", sorted(MIRRORS))
@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize("depth", [1, 2, 3])
def test_a_global_round_sends_hfas_deltas_in_windows_and_lands_the_answers_in_the_job_model(rank: int, depth: int,
                                                                                            mirror: str) -> None:
    layout, model, job_model, bucket, stub, machine = _setup(rank, depth=depth, mirror=mirror)
    before = [tensor.clone() for tensor in job_model]
    assert _blocking_round(machine, model, 1)
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
    assert len(machine.free) == depth, "each buffer reused"
    assert bucket.shared == [[slice_.id for share in layout.owned for slice_ in share]]
    machine.finish()


@pytest.mark.parametrize("k2,delay", [(1, 0), (3, 0), (3, 1), (4, 2)])
def test_the_staged_mirror_sends_and_lands_what_the_in_place_one_does_bit_for_bit(k2: int, delay: int) -> None:
    """The GPU's shape of the path (host buffers apart from the model, both copies on the copier thread) against
    the CPU's: rounds of a model that trains between them, blocking and overlapped, two fragments; every delta
    sent and the job model (after each blocking round; at the end, once every overlapped trip is in) are equal bit
    for bit."""
    runs = {}
    for mirror in MIRRORS:
        layout, model, job_model = _layout_and_models(seed=1)
        rules = LocalFrequencyAggregation(k2=k2, party_weight=WEIGHT, fragments=2 if k2 > 1 else 1)
        if k2 > 1:
            rules.assign_fragments({owned.id: owned.numel for share in layout.owned for owned in share})
        stub = StubRounds()
        party_model = StubModel(layout, 0)
        machine = RoundMachine(rules, stub, party_model, job_model, MIRRORS[mirror](),  # type: ignore[arg-type]
                               delay=delay, window=150)
        models = []
        generator = torch.Generator().manual_seed(2)
        for count in range(1, 3 * k2 + 1):
            machine.copied()
            for tensor in model:  # a step
                tensor.add_(torch.randn(tensor.shape, generator=generator))
            if not delay:
                machine.leave(model, count, priority=[0, 0, 0])
            machine.land(count)
            if delay:
                machine.leave(model, count, priority=[0, 0, 0])
            if not delay:  # an overlapped trip writes the job model when its answers come, between rounds
                models.append([tensor.clone() for tensor in job_model])
        machine.finish()
        models.append([tensor.clone() for tensor in job_model])
        runs[mirror] = stub.history, models
    (sent_a, models_a), (sent_b, models_b) = runs["in_place"], runs["staged"]
    assert {sid for sid, _ in sent_a} == {owned.id for owned in _owned(0)}, "every owned slice went global"
    assert [sid for sid, _ in sent_a] == [sid for sid, _ in sent_b]
    assert all(np.array_equal(a, b) for (_, a), (_, b) in zip(sent_a, sent_b, strict=True))
    for held_a, held_b in zip(models_a, models_b, strict=True):
        assert all(torch.equal(a, b) for a, b in zip(held_a, held_b, strict=True))


def _owned(rank: int) -> list[Any]:
    layout, _, _ = _layout_and_models()
    return layout.owned[rank]


def test_a_slice_larger_than_the_window_is_a_window_alone() -> None:
    _, _, _, _, _, machine = _setup(0, window=150)
    owned = machine.owned
    cut = list(machine.windows(owned))
    assert [slice_ for window in cut for slice_ in window] == owned
    assert all(len(window) == 1 or sum(s.numel for s in window) <= 150 for window in cut)
    _, _, _, _, _, tiny = _setup(0, window=1)
    assert [len(window) for window in tiny.windows(tiny.owned)] == [1] * len(tiny.owned)
    assert tiny.size == max(slice_.numel for slice_ in tiny.owned), "a buffer holds the largest slice"


def test_a_small_models_round_goes_out_in_one_window_and_its_buffer_holds_only_what_the_rank_owns() -> None:
    """The default window is 1/32 of the model but at least MIN_WINDOW elements: a small model's owned slices are
    not held back behind answers (one window, one buffer the size of the rank's share)."""
    layout, model, _, _, stub, machine = _setup(1, window=None, depth=1)
    owned = layout.owned[1]
    assert machine.window == MIN_WINDOW and machine.size == sum(slice_.numel for slice_ in owned)
    assert _blocking_round(machine, model, 1)
    assert stub.windows == [[slice_.id for slice_ in owned]]


def test_a_local_round_sends_nothing_and_shares_nothing() -> None:
    _, model, job_model, bucket, stub, machine = _setup(0, k2=2)
    before = [tensor.clone() for tensor in job_model]
    assert not _blocking_round(machine, model, 1)
    assert stub.windows == [] and bucket.shared == []
    assert all(torch.equal(a, b) for a, b in zip(job_model, before, strict=True))
    assert _blocking_round(machine, model, 2), "the second local round goes global"


def test_depth_must_be_positive_and_a_delay_below_k2() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        _setup(0, depth=0)
    layout, _, job_model = _layout_and_models()
    with pytest.raises(ValueError, match=r"delay \(2\) must be below HFA's K2 \(2\)"):
        RoundMachine(LocalFrequencyAggregation(k2=2, party_weight=WEIGHT), StubRounds(),  # type: ignore[arg-type]
                     StubModel(layout, 0), job_model, InPlaceMirror(), delay=2)  # type: ignore[arg-type]


def _overlapped(mirror: str = "in_place"):
    layout, model, job_model = _layout_and_models()
    rules = LocalFrequencyAggregation(k2=2, party_weight=WEIGHT, fragments=2)  # fragment 0 at odd rounds, 1 at even
    rules.assign_fragments({owned.id: owned.numel for share in layout.owned for owned in share})
    stub, bucket = StubRounds(), StubModel(layout, 0)
    machine = RoundMachine(rules, stub, bucket, job_model, MIRRORS[mirror](), delay=1,  # type: ignore[arg-type]
                           group=SimpleNamespace(rank=0))  # type: ignore[arg-type]
    first = [owned for owned in machine.owned if rules.goes_global(owned.id, 1)]
    assert first and len(first) < len(machine.owned), "fragment 0 leaves at round 1, alone"
    return model, job_model, stub, machine, first, bucket


@pytest.mark.parametrize("mirror", sorted(MIRRORS))
def test_an_overlapped_fragment_leaves_with_the_values_of_its_round(mirror: str) -> None:
    """The leaving slices are copied on a thread while the rank goes on (it waits for the copy before its
    optimizer's step, ``copied``); what leaves is the model as it was at the round, and the answers land in the
    job's model one round later."""
    model, job_model, stub, machine, first, bucket = _overlapped(mirror)
    base, at_round = [t.clone() for t in job_model], [t.clone() for t in model]
    assert not machine.land(1)
    machine.leave(model, 1, priority=[0, 0, 0])
    assert machine.copy is not None, "the copy is the thread's"
    machine.copied()
    for tensor in model:  # the next step changes the model
        tensor.add_(1.0)
    assert machine.land(2)
    for owned in first:
        range_ = slice(owned.start, owned.stop)
        expected = (at_round[owned.key][range_] - base[owned.key][range_]).numpy() * WEIGHT
        np.testing.assert_allclose(stub.sent[owned.id], expected, rtol=1e-6)
        np.testing.assert_allclose(job_model[owned.key][range_].numpy(), expected + 100.0, rtol=1e-6)
    assert bucket.shared[-1] == [owned.id for share in bucket.layout.owned for owned in share
                                 if owned.id[0] >= 0 and machine.rules.goes_global(owned.id, 1)]
    machine.finish()


def test_the_job_model_is_read_between_a_trips_writes() -> None:
    """``RoundMachine.reading``: while a trip writes the job model (its answers, then the share with the party)
    a reader waits, so it never sees a slice half written; it goes on once the share is done."""
    model, _, _, machine, _, bucket = _overlapped()
    in_share, release, read = threading.Event(), threading.Event(), threading.Event()

    def share(tensors: Sequence[torch.Tensor], only: Any = None, group: Any = None) -> None:
        in_share.set()
        assert release.wait(30), "the test never released the share"

    bucket.share = share  # type: ignore[method-assign]
    machine.land(1)
    machine.leave(model, 1, priority=[0, 0, 0])
    assert in_share.wait(30), "the trip never reached its share"

    def reader() -> None:
        with machine.reading() as held:
            assert held is machine.job_model
            read.set()

    thread = threading.Thread(target=reader)
    thread.start()
    assert not read.wait(0.3), "the job model was read while the trip was writing it"
    release.set()
    assert read.wait(30), "the reader never got the job model after the share"
    thread.join(30)
    machine.land(2)
    machine.finish()


def test_decoupled_rounds_tokens_go_with_each_send_blocking_and_overlapped() -> None:
    """The party's tokens behind each leaving slice reach the send of its window (blocking) or of its trip."""
    for delay in (0, 1):
        layout, model, job_model = _layout_and_models()
        stub = StubRounds()
        machine = RoundMachine(LocalFrequencyAggregation(k2=2, party_weight=1.0), stub,  # type: ignore[arg-type]
                               StubModel(layout, 0), job_model, InPlaceMirror(), delay=delay, window=250)
        counts = {owned.id: 6 for owned in layout.owned[0]}
        machine.leave(model, 1, priority=[0, 0, 0], tokens=counts)
        assert stub.tokens == [], "a local round sends nothing"
        machine.land(2)
        machine.leave(model, 2, priority=[0, 0, 0], tokens=counts)
        machine.copied()
        machine.land(3)
        assert stub.tokens and all(sent is counts for sent in stub.tokens), delay
        machine.finish()
