"""The party's mean gradient, all-reduced bucket by bucket as backward makes it (``geomx.collective.overlap``),
over an in-process group of two ranks whose other rank made the same gradients (its all-reduce doubles)."""

from __future__ import annotations

import torch
from torch import nn

from geomx.collective.layout import OwnerLayout
from geomx.collective.overlap import OverlappedMean
from geomx.collective.owners import SliceOwners
from geomx.core.sharding import slice_plan


class _Done:
    def wait(self) -> None:
        pass


class TwinGroup:
    """Two ranks with equal gradients: an all-reduce doubles; records when each one started."""

    party, rank, world_size = "dc0", 0, 2

    def __init__(self) -> None:
        self.started: list[int] = []  # the numel of each all-reduce, in start order

    def all_reduce_async(self, tensor: torch.Tensor) -> _Done:
        self.started.append(tensor.numel())
        tensor.mul_(2)
        return _Done()

    def all_reduce(self, tensor: torch.Tensor) -> None:
        self.all_reduce_async(tensor)


def _mean(model: nn.Module, group: TwinGroup, bucket_bytes: int, trained: list[int] | None = None) -> OverlappedMean:
    params = list(model.parameters())
    owners = SliceOwners(2)
    for key, p in enumerate(params):
        owners.add(key, slice_plan(p.numel(), 64), itemsize=4)

    def layout_of(keys: list[int]) -> OwnerLayout:
        return OwnerLayout(owners, {k: params[k].numel() for k in keys})

    mean = OverlappedMean(group, params, layout_of, bucket_bytes, trained=trained)  # type: ignore[arg-type]
    for key, p in enumerate(params):
        p.register_post_accumulate_grad_hook(lambda param, key=key: mean.on_gradient(key, param.grad))
    return mean


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 4))


def test_buckets_start_during_backward_and_finish_leaves_the_mean_in_grad() -> None:
    model, group = _model(), TwinGroup()
    mean = _mean(model, group, bucket_bytes=600)  # several buckets
    x = torch.randn(5, 8)
    model(x).square().sum().backward()
    assert len(group.started) == len(mean.buckets) > 2, "every bucket started inside backward"
    reference = _model()
    reference(x).square().sum().backward()
    mean.finish()
    for got, want in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(got.grad, want.grad)  # (2 g) / 2


def test_an_untrained_or_unused_parameter_counts_as_zero() -> None:
    model, group = _model(), TwinGroup()
    mean = _mean(model, group, bucket_bytes=1 << 20, trained=[0, 1, 2, 3])  # the last layer is frozen
    model[4].weight.requires_grad_(False)
    model[4].bias.requires_grad_(False)
    model(torch.randn(5, 8)).sum().backward()
    assert len(group.started) == 1, "one bucket, started inside backward: it waits for no frozen parameter"
    mean.finish()
    assert torch.count_nonzero(model[4].weight.grad) == 0 and torch.count_nonzero(model[0].weight.grad) > 0


def test_a_second_backward_before_the_step_averages_the_accumulated_grad() -> None:
    model, group = _model(), TwinGroup()
    mean = _mean(model, group, bucket_bytes=600)
    first, second = torch.randn(5, 8), torch.randn(3, 8)
    model(first).sum().backward()
    model(second).sum().backward()  # gradient accumulation
    mean.finish()
    reference = _model()
    reference(first).sum().backward()
    reference(second).sum().backward()
    for got, want in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(got.grad, want.grad)
    model.zero_grad()
    model(first).sum().backward()  # and the next step overlaps again
    started = len(group.started)
    assert started > 0 and mean.accumulating is False
