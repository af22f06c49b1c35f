"""FSA in a collective party lands a bucket's answers, and starts its all-gather, while backward still computes later
buckets (``geomx.algorithms.fsa.collective``), on a group whose exchanges go rank to rank; on one without (NCCL)
only after backward. A one-rank party whose global server steps SGD (``FakeRanks``): either way the step leaves the
weights of plain SGD, and a bucket whose answers are not all in waits for ``step``."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from geomx.algorithms.fsa.collective import CollectiveServerStep
from geomx.collective.layout import OwnerLayout
from geomx.collective.owners import OwnedSlice, SliceOwners
from geomx.core.sharding import slice_plan

LR = 0.1


class _Done:
    def wait(self) -> None:
        pass

    def done(self) -> bool:
        return True


class OneRankGroup:
    """A party of one rank: a reduce-scatter leaves the buffer as it is; all-gathers are recorded by lane."""

    party, rank, world_size = "dc0", 0, 1

    def __init__(self, direct: bool) -> None:
        self.direct = direct
        self.gathers: list[str] = []  # the lane of each all-gather, in start order

    def reduce_scatter_async(self, chunk: torch.Tensor, buffer: torch.Tensor) -> _Done:
        chunk.copy_(buffer)
        return _Done()

    def all_gather_async(self, buffer: torch.Tensor, chunk: torch.Tensor, lane: str = "main") -> _Done:
        self.gathers.append(lane)
        buffer.copy_(chunk)
        return _Done()


class FakeRanks:
    """The slices' owners (all this rank's) and a global server that answers each push with ``weight - LR *
    gradient``; ``answer_now``: each push's future is done when sent, else when the test says."""

    def __init__(self, params: list[nn.Parameter], group: OneRankGroup, answer_now: bool) -> None:
        self.params, self.group, self.answer_now = params, group, answer_now
        self.owners = SliceOwners(1)
        for key, p in enumerate(params):
            self.owners.add(key, slice_plan(p.numel(), 16), itemsize=4)
        self.unanswered: list[tuple[Future[torch.Tensor], torch.Tensor]] = []  # until ``answer_all``

    def layout(self, keys: list[int]) -> OwnerLayout:
        return OwnerLayout(self.owners, {k: self.params[k].numel() for k in keys})

    def send(self, pieces: list[tuple[OwnedSlice, torch.Tensor]], priority: Any) -> list[Future[torch.Tensor]]:
        futures = []
        for owned, piece in pieces:
            future: Future[torch.Tensor] = Future()
            weight = self.params[owned.key].detach().reshape(-1)[owned.start:owned.stop]
            answer = weight - LR * piece
            if self.answer_now:
                future.set_result(answer)
            else:
                self.unanswered.append((future, answer))
            futures.append(future)
        return futures

    def answer_all(self) -> None:
        for future, answer in self.unanswered:
            future.set_result(answer)
        self.unanswered = []

    def land(self, pieces: list[tuple[OwnedSlice, torch.Tensor]], futures: list[Future[torch.Tensor]]) -> None:
        for (_, piece), future in zip(pieces, futures, strict=True):
            piece.copy_(future.result(timeout=5))


def _run(direct: bool, answer_now: bool) -> tuple[CollectiveServerStep, OneRankGroup, FakeRanks, list[torch.Tensor],
                                                   int]:
    """One step of a three-layer model in buckets of about one tensor each; returns the strategy, the group, the
    ranks, the weights plain SGD gives and the all-gathers started before ``step``."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 8), nn.ReLU(), nn.Linear(8, 3))
    params = list(model.parameters())
    group = OneRankGroup(direct)
    ranks = FakeRanks(params, group, answer_now)
    kv = SimpleNamespace(num_all_workers=1,
                         config=SimpleNamespace(topology=SimpleNamespace(training=SimpleNamespace(bucket_bytes=200))))
    loop = SimpleNamespace(kv=kv, ranks=ranks, params=params, names=[str(k) for k in range(len(params))],
                           trained=list(range(len(params))), priority=[0] * len(params), pushed=set(), ddp=None,
                           waited=lambda seconds: None, warn_once=lambda tag, text: None)
    strategy = CollectiveServerStep(loop)  # type: ignore[arg-type]
    strategy.init_keys()
    for key, p in enumerate(params):
        p.register_post_accumulate_grad_hook(lambda param, key=key: strategy.on_gradient(key, param.grad))
    model(torch.randn(4, 6)).square().sum().backward()
    expected = [(p - LR * p.grad).detach().clone() for p in params]
    return strategy, group, ranks, expected, len(group.gathers)


def test_answers_that_are_in_land_and_gather_during_backward() -> None:
    strategy, group, ranks, expected, before_step = _run(direct=True, answer_now=True)
    assert len(strategy.buckets) >= 4, len(strategy.buckets)
    assert before_step == len(strategy.buckets), "every bucket's answers were in: each gathered during backward"
    assert set(group.gathers) == {"answers"}, group.gathers  # their own lane of tags
    strategy.step()
    for p, want in zip(ranks.params, expected, strict=True):
        assert torch.equal(p.detach(), want)


@pytest.mark.parametrize(("direct", "answer_now"), [(True, False), (False, True)],
                         ids=["answers-not-in-yet", "no-rank-to-rank-exchanges"])
def test_otherwise_the_answers_land_in_step(direct: bool, answer_now: bool) -> None:
    strategy, group, ranks, expected, before_step = _run(direct, answer_now)
    assert before_step == 0
    ranks.answer_all()
    strategy.step()
    assert len(group.gathers) == len(strategy.buckets)
    for p, want in zip(ranks.params, expected, strict=True):
        assert torch.equal(p.detach(), want)
