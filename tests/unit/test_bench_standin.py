"""The accelerator stand-in (``geomx.bench.standin``): its wait, its deltas and the utilization formula, on a fake
clock; and the seam it replaces (``WorkerStrategy.inner_step``)."""

from __future__ import annotations

import pytest
import torch

from geomx.bench.standin import StandIn, realistic_deltas, utilization
from geomx.runs.runlog import peak_rss_bytes


class FakeClock:
    """A clock that moves only when slept on, or by ``work`` seconds when the stand-in applies a delta."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_no_sync_is_full_utilization() -> None:
    """A job with no sync at all: the loop's wall time is the steps' own, so utilization is exactly 1."""
    clock = FakeClock()
    param = torch.zeros(3)
    stand_in = StandIn([param], [torch.ones(3)], step_s=0.04, apply_every=5, clock=clock, sleep=clock.sleep)
    for _ in range(20):
        stand_in.step()
    assert clock.now == pytest.approx(20 * 0.04)
    assert utilization(20, 0.04, clock.now) == pytest.approx(1.0)


def test_blocked_time_lowers_utilization() -> None:
    assert utilization(100, 0.04, 8.0) == pytest.approx(0.5)
    assert utilization(100, 0.04, 4.0) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="positive"):
        utilization(1, 0.04, 0.0)


def test_deltas_land_every_local_round_times_its_steps() -> None:
    """At every round's end the parameters have moved by delta x the round's steps, exactly as moving all of them
    at the last step would; in between, each step moves its own part, once."""
    clock = FakeClock()
    params = [torch.zeros(3, 2), torch.zeros(5)]
    deltas = [torch.arange(6.0).view(3, 2), torch.full((5,), -1.0)]
    stand_in = StandIn(params, deltas, step_s=0.01, apply_every=4, clock=clock, sleep=clock.sleep)
    moved = []
    for _ in range(4):
        before = torch.cat([p.view(-1) for p in params])
        stand_in.step()
        moved.append(int((torch.cat([p.view(-1) for p in params]) != before).sum()))
    assert params[0].tolist() == (4 * deltas[0]).tolist() and params[1].tolist() == [-4.0] * 5
    # 11 elements in parts of ceil(11 / 4) = 3 (the first tensor's element 0 has a delta of 0: it stays)
    assert moved == [2, 3, 3, 2]
    for _ in range(4):
        stand_in.step()
    assert params[0].tolist() == (8 * deltas[0]).tolist() and params[1].tolist() == [-8.0] * 5


def test_without_apply_every_nothing_moves() -> None:
    clock = FakeClock()
    param = torch.zeros(4)
    stand_in = StandIn([param], [torch.ones(4)], step_s=0.01, apply_every=None, clock=clock, sleep=clock.sleep)
    for _ in range(10):
        stand_in.step()
    assert param.tolist() == [0.0] * 4 and clock.now == pytest.approx(0.1)


def test_a_step_that_overruns_counts_its_excess() -> None:
    """Work longer than the step (a delta on a loaded machine) is not hidden: the excess is counted, no sleep."""
    readings = iter([0.0, 0.025])  # the step begins; the delta took 25 ms of a 10 ms step
    slept: list[float] = []
    stand_in = StandIn([torch.zeros(1)], [torch.ones(1)], step_s=0.01, apply_every=1,
                       clock=lambda: next(readings), sleep=slept.append)
    stand_in.step()
    assert stand_in.overrun_s == pytest.approx(0.015)
    assert slept == []


def test_compute_then_move_is_a_step_whose_move_is_all_overrun() -> None:
    """A loop shaped as training (compute, then the optimizer's step): ``compute`` waits a whole step, ``move``
    changes the parameters as ``step`` would and counts all of its time as overrun."""
    readings = iter([0.0, 0.0, 0.04, 0.04, 0.043])  # compute: start, sleep, end; move: 3 ms of delta
    slept: list[float] = []
    param = torch.zeros(2)
    stand_in = StandIn([param], [torch.ones(2)], step_s=0.04, apply_every=1, clock=lambda: next(readings),
                       sleep=slept.append)
    stand_in.compute()
    assert slept == [pytest.approx(0.04)] and param.tolist() == [0.0, 0.0]
    stand_in.move()
    assert param.tolist() == [1.0, 1.0] and stand_in.steps == 1
    assert stand_in.overrun_s == pytest.approx(0.003)


def test_the_syncs_device_work_on_the_host_is_timed_apart_and_raises_through() -> None:
    """A landing's mix (``on_device``): its host time goes to ``device_s``, not ``overrun_s``, failing or not."""
    clock = FakeClock()
    stand_in = StandIn([torch.zeros(2)], [torch.ones(2)], step_s=0.04, apply_every=1, clock=clock, sleep=clock.sleep)
    seen = []
    mix = stand_in.on_device(lambda views, count: (seen.append(count), clock.sleep(0.025)))
    mix([], 3)
    assert seen == [3] and stand_in.device_s == pytest.approx(0.025) and stand_in.overrun_s == 0.0

    def failing(*_: object) -> None:
        clock.sleep(0.01)
        raise RuntimeError("a trip failed")

    with pytest.raises(RuntimeError, match="a trip failed"):
        stand_in.on_device(failing)()
    assert stand_in.device_s == pytest.approx(0.035)


def test_realistic_deltas_are_sgd_steps_of_one_real_gradient() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    x, y = torch.randn(8, 4), torch.randn(8, 2)
    deltas = realistic_deltas(list(model.parameters()), lambda: ((model(x) - y) ** 2).mean(), lr=0.1)
    for param, delta in zip(model.parameters(), deltas, strict=True):
        assert param.grad is not None
        assert torch.allclose(delta, -0.1 * param.grad)
        assert delta.abs().sum() > 0


def test_periodic_strategies_step_through_the_seam() -> None:
    """HFA's worker step calls ``inner_step`` (the wrapped optimizer, through ``loop.update``): replaced, the wrapped
    optimizer is never stepped."""
    from types import SimpleNamespace

    from geomx.algorithms.hfa.strategy import PeriodicAverage

    calls: list[str] = []
    loop = SimpleNamespace(synchronize=lambda: calls.append("sync"), update=lambda: calls.append("optimizer"))
    strategy = PeriodicAverage(loop, k1=3)  # type: ignore[arg-type]
    strategy.step()
    assert calls == ["sync", "optimizer"]
    strategy.inner_step = lambda: calls.append("stand-in")  # type: ignore[method-assign]
    strategy.step()
    assert calls[-1] == "stand-in" and calls.count("optimizer") == 1


def test_peak_rss_is_this_process() -> None:
    before = peak_rss_bytes()
    block = bytearray(64 << 20)  # touched: resident
    block[::4096] = b"x" * len(block[::4096])
    assert peak_rss_bytes() >= before
    assert peak_rss_bytes() > 64 << 20
