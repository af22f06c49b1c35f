"""geomx.torch.FrozenVarianceAdam: Adam until ``freeze_after`` steps, then Adam with its variance held."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from geomx.torch import FrozenVarianceAdam


def _params(seed: int = 0) -> list[torch.nn.Parameter]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(5, 7, generator=generator)),
            torch.nn.Parameter(torch.randn(11, generator=generator))]


def _grads(steps: int, seed: int = 1) -> list[list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [[torch.randn(5, 7, generator=generator), torch.randn(11, generator=generator)] for _ in range(steps)]


def _step(opt: torch.optim.Optimizer, params: list[torch.nn.Parameter], grads: list[torch.Tensor]) -> None:
    for p, g in zip(params, grads, strict=True):
        p.grad = g.clone()
    opt.step()


@pytest.mark.parametrize("decoupled", [True, False])
def test_it_is_torch_adam_until_the_freeze(decoupled: bool) -> None:
    ours, theirs = _params(), _params()
    frozen = FrozenVarianceAdam(ours, lr=1e-2, weight_decay=0.1, decoupled_weight_decay=decoupled, freeze_after=6)
    adam = torch.optim.Adam(theirs, lr=1e-2, weight_decay=0.1, decoupled_weight_decay=decoupled)
    for grads in _grads(6):
        _step(frozen, ours, grads)
        _step(adam, theirs, grads)
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a, b)
    assert frozen.frozen()


@pytest.mark.parametrize("decoupled", [True, False])
def test_after_the_freeze_the_variance_is_held_and_the_step_is_adam_s_on_it(decoupled: bool) -> None:
    """The variance held from the first frozen step on, raised once, at that step, to a thousandth of its tensor's mean
    where it was below."""
    params = _params()
    lr, decay, (beta1, beta2), eps, freeze = 1e-2, 0.1, (0.9, 0.999), 1e-8, 4
    opt = FrozenVarianceAdam(params, lr=lr, weight_decay=decay, decoupled_weight_decay=decoupled,
                             freeze_after=freeze)
    grads = _grads(10)
    for g in grads[:freeze]:
        _step(opt, params, g)
    held = [opt.state[p]["exp_avg_sq"].double().clone() for p in params]
    for v in held:
        v.clamp_(min=float(v.mean()) * 1e-3)
    expected = [p.detach().double().clone() for p in params]
    moments = [opt.state[p]["exp_avg"].double().clone() for p in params]
    for step, g in enumerate(grads[freeze:], freeze + 1):
        _step(opt, params, g)
        for k, (x, m, v) in enumerate(zip(expected, moments, held, strict=True)):
            grad = g[k].double() if decoupled else g[k].double() + decay * x
            if decoupled:
                x *= 1 - lr * decay
            m.mul_(beta1).add_((1 - beta1) * grad)
            x -= lr / (1 - beta1 ** step) * m / (v.sqrt() / math.sqrt(1 - beta2 ** freeze) + eps)
    for p, v, x in zip(params, held, expected, strict=True):
        torch.testing.assert_close(opt.state[p]["exp_avg_sq"].double(), v)
        torch.testing.assert_close(p.detach().double(), x, rtol=1e-5, atol=1e-6)
        assert int(opt.state[p]["step"]) == 10


def _displacement(optimizer: type[torch.optim.Optimizer], answers: list[float], **kwargs: float) -> float:
    """How far a weight moves when the warmed-up optimizer steps on ``answers`` then on 300 zeros."""
    weight = torch.nn.Parameter(torch.zeros(1))
    opt = optimizer([weight], lr=1e-3, **kwargs)
    for g in _grads(50, seed=3):
        weight.grad = g[1][:1].clone()
        opt.step()
    start = float(weight.detach())
    for answer in answers + [0.0] * 300:
        weight.grad = torch.tensor([answer])
        opt.step()
    return float(weight.detach()) - start


def test_a_burst_moves_a_weight_as_far_as_the_steps_it_stands_for() -> None:
    """What error feedback needs: ten steps' gradient arriving at once (30 times over) moves the weight as the ten
    steps would. Adam moves it less than half as far (its variance fed the bursts): the reason this class exists."""
    spread, burst = [0.5] * 10 * 30, ([5.0] + [0.0] * 9) * 30
    frozen_spread = _displacement(FrozenVarianceAdam, spread, freeze_after=50)
    frozen_burst = _displacement(FrozenVarianceAdam, burst, freeze_after=50)
    assert frozen_burst == pytest.approx(frozen_spread, rel=1e-3)  # up to the momentum's bias correction
    adam_spread, adam_burst = _displacement(torch.optim.Adam, spread), _displacement(torch.optim.Adam, burst)
    assert abs(adam_burst) < 0.5 * abs(adam_spread)  # 0.103 against 0.224


def test_a_coordinate_without_variance_at_the_freeze_takes_the_floor() -> None:
    """A weight whose gradients were all zero until the freeze (a dead unit): its variance is raised to a thousandth
    of its tensor's mean, so its first gradient moves it by tens of lr, not by g / eps."""
    weight = torch.nn.Parameter(torch.zeros(2))
    opt = FrozenVarianceAdam([weight], lr=1e-3, freeze_after=5)
    for _ in range(5):
        weight.grad = torch.tensor([1.0, 0.0])
        opt.step()
    assert float(opt.state[weight]["exp_avg_sq"][1]) == 0.0
    before = float(weight.detach()[1])
    weight.grad = torch.tensor([0.0, 3.0])
    opt.step()
    variance = opt.state[weight]["exp_avg_sq"]
    assert float(variance[1]) == pytest.approx(float(variance[0]) / 2 * 1e-3)
    assert 0 < before - float(weight.detach()[1]) < 0.1  # 0.029; without the floor 3e-3 * 0.64 / 1e-8


def test_a_checkpoint_resumes_the_frozen_phase() -> None:
    params = _params()
    opt = FrozenVarianceAdam(params, lr=1e-2, freeze_after=3)
    grads = _grads(8)
    for g in grads[:5]:
        _step(opt, params, g)
    saved_params = copy.deepcopy([p.detach() for p in params])
    saved_state = copy.deepcopy(opt.state_dict())
    for g in grads[5:]:
        _step(opt, params, g)
    resumed = [torch.nn.Parameter(p.clone()) for p in saved_params]
    again = FrozenVarianceAdam(resumed, lr=1e-2, freeze_after=99)  # the checkpoint's groups say 3
    again.load_state_dict(saved_state)
    assert again.frozen()
    for g in grads[5:]:
        _step(again, resumed, g)
    for a, b in zip(params, resumed, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("freeze_after", [0, -1, 2.5, True])
def test_a_bad_freeze_after_is_refused_by_name(freeze_after: object) -> None:
    with pytest.raises(ValueError, match="freeze_after"):
        FrozenVarianceAdam(_params(), freeze_after=freeze_after)  # type: ignore[arg-type]


def test_a_parameter_without_gradients_does_not_hold_back_the_freeze_of_the_others() -> None:
    """An unused parameter (no gradient yet) must not keep the rest in Adam forever; when its gradients start after
    the others froze, it takes Adam's steps (its variance measured) until it has taken its own ``freeze_after``."""
    used, unused = torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2))
    opt = FrozenVarianceAdam([used, unused], lr=1e-2, freeze_after=3)
    for g in _grads(3):
        used.grad = g[1][:3].clone()
        opt.step()
    held = opt.state[used]["exp_avg_sq"].clone()
    assert opt.frozen()
    variances = []
    for g in _grads(6, seed=4):
        used.grad, unused.grad = g[1][:3].clone(), g[1][3:5].clone()
        opt.step()
        variances.append(opt.state[unused]["exp_avg_sq"].clone())
    assert torch.equal(opt.state[used]["exp_avg_sq"], torch.maximum(held, held.mean() * 1e-3))
    assert int(opt.state[unused]["step"]) == 6
    assert not torch.equal(variances[0], variances[2])  # measured in its first 3 steps
    assert torch.equal(variances[3], variances[5])  # frozen after them
