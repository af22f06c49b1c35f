"""Server optimizers against torch.optim, and their JSON specs."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from geomx import optim
from geomx.optim import DCASGD, SGD, Adam, DCAdam, OuterNesterov, optimizer_from_spec

STEPS = 6
SHAPES = [(17,), (4, 5), (2, 3, 4)]


def random_problem(shape, seed):
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(shape, generator=generator)
    grads = [torch.randn(shape, generator=generator) * 3 for _ in range(STEPS)]
    return weight, grads


def run_geomx(optimizer, weight, grads, sid=(0, 0)):
    w = weight.numpy().copy()
    history = []
    for g in grads:
        w = optimizer.step(sid, w, g.numpy())
        history.append(w.copy())
    return history


def run_torch(cls, kwargs, weight, grads, scale=1.0):
    param = torch.nn.Parameter(weight.clone())
    opt = cls([param], **kwargs)
    history = []
    for g in grads:
        param.grad = g * scale if scale != 1.0 else g.clone()
        opt.step()
        history.append(param.detach().numpy().copy())
    return history


def assert_same_trajectory(ours, theirs):
    assert len(ours) == len(theirs)
    for step, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        assert a.dtype == np.float32
        torch.testing.assert_close(torch.from_numpy(a), torch.from_numpy(b), msg=lambda m, s=step: f"step {s}: {m}")


SGD_CASES = [
    {"lr": 0.1},
    {"lr": 0.05, "momentum": 0.9},
    {"lr": 0.05, "weight_decay": 0.01},
    {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.001},
    {"lr": 0.02, "momentum": 0.8, "nesterov": True},
    {"lr": 0.02, "momentum": 0.5, "weight_decay": 0.1, "nesterov": True},
]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("kwargs", SGD_CASES, ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()))
def test_sgd_matches_torch(kwargs, shape):
    weight, grads = random_problem(shape, seed=len(shape) * 31 + len(kwargs))
    ours = run_geomx(SGD(**kwargs), weight, grads)
    theirs = run_torch(torch.optim.SGD, kwargs, weight, grads)
    assert_same_trajectory(ours, theirs)
    # the weights really moved, so the comparison means something
    assert not np.allclose(ours[-1], weight.numpy())


ADAM_CASES = [
    ({"lr": 0.01}, {"lr": 0.01}),
    ({"lr": 0.1, "beta1": 0.8, "beta2": 0.99, "epsilon": 1e-6},
     {"lr": 0.1, "betas": (0.8, 0.99), "eps": 1e-6}),
    ({"lr": 0.01, "weight_decay": 0.05}, {"lr": 0.01, "weight_decay": 0.05}),
]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("ours_kwargs,torch_kwargs", ADAM_CASES, ids=["default", "betas-eps", "weight_decay"])
def test_adam_matches_torch(ours_kwargs, torch_kwargs, shape):
    weight, grads = random_problem(shape, seed=7 + len(shape))
    ours = run_geomx(Adam(**ours_kwargs), weight, grads)
    theirs = run_torch(torch.optim.Adam, torch_kwargs, weight, grads)
    assert_same_trajectory(ours, theirs)
    assert not np.allclose(ours[-1], weight.numpy())


@pytest.mark.parametrize("scale", [0.25, 1 / 3, 2.0])
def test_rescale_grad_sgd(scale):
    weight, grads = random_problem((10,), seed=3)
    ours = run_geomx(SGD(lr=0.1, momentum=0.9, rescale_grad=scale), weight, grads)
    theirs = run_torch(torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}, weight, grads, scale=scale)
    assert_same_trajectory(ours, theirs)
    unscaled = run_geomx(SGD(lr=0.1, momentum=0.9), weight, grads)
    assert not np.allclose(ours[-1], unscaled[-1])


@pytest.mark.parametrize("scale", [0.25, 1e-3])
def test_rescale_grad_adam_with_weight_decay(scale):
    # Adam is almost scale invariant, except through weight decay and epsilon: make both matter
    weight, grads = random_problem((10,), seed=4)
    ours = run_geomx(Adam(lr=0.05, weight_decay=0.5, epsilon=1e-3, rescale_grad=scale), weight, grads)
    theirs = run_torch(torch.optim.Adam, {"lr": 0.05, "weight_decay": 0.5, "eps": 1e-3}, weight, grads, scale=scale)
    assert_same_trajectory(ours, theirs)


def test_rescale_none_and_one_are_the_raw_sum():
    weight, grads = random_problem((8,), seed=5)
    a = run_geomx(SGD(lr=0.1), weight, grads)
    b = run_geomx(SGD(lr=0.1, rescale_grad=1.0), weight, grads)
    np.testing.assert_array_equal(a[-1], b[-1])


@pytest.mark.parametrize("make", [lambda: SGD(lr=0.1, momentum=0.9), lambda: Adam(lr=0.01)], ids=["sgd", "adam"])
def test_state_is_kept_per_slice(make):
    """Two slices interleaved on one optimizer == two independent torch optimizers."""
    optimizer = make()
    w1, g1 = random_problem((6,), seed=10)
    w2, g2 = random_problem((3, 2), seed=11)
    cls, kwargs = ((torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}) if isinstance(optimizer, SGD)
                   else (torch.optim.Adam, {"lr": 0.01}))
    a, b = w1.numpy().copy(), w2.numpy().copy()
    ours1, ours2 = [], []
    for x, y in zip(g1, g2, strict=True):
        a = optimizer.step((0, 0), a, x.numpy())
        b = optimizer.step((0, 1), b, y.numpy())
        ours1.append(a.copy())
        ours2.append(b.copy())
    assert_same_trajectory(ours1, run_torch(cls, kwargs, w1, g1))
    assert_same_trajectory(ours2, run_torch(cls, kwargs, w2, g2))


def test_step_returns_a_new_array_and_leaves_inputs_alone():
    optimizer = SGD(lr=0.5, momentum=0.9, weight_decay=0.1)
    weight = np.arange(5, dtype=np.float32)
    grad = np.ones(5, dtype=np.float32)
    weight_before, grad_before = weight.copy(), grad.copy()
    for _ in range(3):
        new = optimizer.step((1, 0), weight, grad)
        assert new is not weight and not np.shares_memory(new, weight)
        assert not np.shares_memory(new, grad)
    np.testing.assert_array_equal(weight, weight_before)
    np.testing.assert_array_equal(grad, grad_before)


def test_step_accepts_read_only_wire_buffers():
    """Gradients arrive as read-only views of received frames."""
    weight = np.frombuffer(np.arange(4, dtype=np.float32).tobytes(), dtype=np.float32)
    grad = np.frombuffer(np.ones(4, dtype=np.float32).tobytes(), dtype=np.float32)
    assert not weight.flags.writeable and not grad.flags.writeable
    new = Adam(lr=0.1).step((0, 0), weight, grad)
    assert new.dtype == np.float32 and new.shape == (4,)
    assert np.all(new < np.arange(4, dtype=np.float32))


def test_step_casts_to_float32():
    new = SGD(lr=1.0).step((0, 0), np.zeros(3, np.float64), np.ones(3, np.float64))
    assert new.dtype == np.float32
    np.testing.assert_array_equal(new, -np.ones(3, np.float32))


# ---------------------------------------------------------------------------------------------------------
# Specs


@pytest.mark.parametrize("optimizer", [
    SGD(),
    SGD(lr=0.1, momentum=0.9, weight_decay=1e-4, nesterov=True, rescale_grad=0.25),
    Adam(),
    Adam(lr=3e-4, beta1=0.5, beta2=0.9, epsilon=1e-6, weight_decay=0.01, rescale_grad=1.0),
], ids=["sgd-default", "sgd-full", "adam-default", "adam-full"])
def test_spec_round_trip(optimizer):
    spec = optimizer.spec()
    assert spec["name"] == optimizer.name
    wire_spec = json.loads(json.dumps(spec))  # it travels as JSON
    rebuilt = optimizer_from_spec(wire_spec)
    assert type(rebuilt) is type(optimizer)
    assert rebuilt == optimizer
    assert rebuilt.spec() == spec


def test_spec_round_trip_behaves_the_same():
    original = SGD(lr=0.1, momentum=0.9, nesterov=True, rescale_grad=0.5)
    rebuilt = optimizer_from_spec(json.loads(json.dumps(original.spec())))
    weight, grads = random_problem((9,), seed=12)
    np.testing.assert_array_equal(run_geomx(original, weight, grads)[-1], run_geomx(rebuilt, weight, grads)[-1])


def test_spec_name_is_case_insensitive_and_params_optional():
    assert optimizer_from_spec({"name": "ADAM"}) == Adam()
    assert optimizer_from_spec({"name": "Sgd", "params": None}) == SGD()
    assert optimizer_from_spec({"name": "sgd", "params": {"lr": 1}}).lr == 1.0


def test_registry_lists_all():
    assert {"sgd": SGD, "adam": Adam, "dcasgd": DCASGD, "dcadam": DCAdam,
            "outer_nesterov": OuterNesterov} == optim.OPTIMIZERS


def test_unknown_optimizer_name():
    valid = r"\['adam', 'dcadam', 'dcasgd', 'outer_nesterov', 'sgd'\]"
    with pytest.raises(ValueError, match=rf"unknown optimizer 'lamb'; valid: {valid}"):
        optimizer_from_spec({"name": "lamb", "params": {}})


@pytest.mark.parametrize("name,params,listed", [
    ("sgd", {"learning_rate": 0.1}, r"\['learning_rate'\]"),
    ("sgd", {"lr": 0.1, "betas": 0.9, "eps": 1}, r"\['betas', 'eps'\]"),  # torch's Adam names, on SGD
    ("adam", {"momentum": 0.9}, r"\['momentum'\]"),
])
def test_unknown_parameter(name, params, listed):
    with pytest.raises(ValueError, match=f"optimizer '{name}' has no parameters {listed}; valid: "):
        optimizer_from_spec({"name": name, "params": params})


@pytest.mark.parametrize("key,value", [("lr", math.nan), ("lr", math.inf), ("momentum", -math.inf),
                                       ("weight_decay", "0.1"), ("lr", None), ("lr", [0.1]),
                                       ("rescale_grad", math.nan)])
def test_non_finite_or_non_numeric_value(key, value):
    with pytest.raises(ValueError, match=f"optimizer parameter {key}="):
        optimizer_from_spec({"name": "sgd", "params": {key: value}})


@pytest.mark.parametrize("spec", [None, "sgd", {"params": {}}, {"name": 3}, ["sgd"]])
def test_malformed_spec(spec):
    with pytest.raises(ValueError, match="an optimizer spec is"):
        optimizer_from_spec(spec)


def test_params_must_be_an_object():
    with pytest.raises(ValueError, match="params must be an object"):
        optimizer_from_spec({"name": "sgd", "params": [0.1]})


# ---------------------------------------------------------------------------------------------------------
# DCASGD: replayed in NumPy (the paper's update), with one backup per party


def dcasgd_reference(weight, pushes, lr, momentum, lamda, weight_decay=0.0, rescale=1.0, seeded=()):
    """pushes: [(party, grad)] in arrival order -> final weights, by MXNet's DCASGD formula in float64.

    ``mom = momentum * mom - lr * (g + wd * w + lamda * g * g * (w - w_bak))`` with ``g = rescale * grad``;
    ``w_bak`` is one backup per party: the parties in ``seeded`` start from ``weight`` (INIT), the others
    have none until their first push (then their first push is not compensated).
    """
    w = weight.astype(np.float64)
    backup: dict[str, np.ndarray] = {party: w.copy() for party in seeded}
    mom = np.zeros_like(w)
    for party, grad in pushes:
        g = rescale * grad.astype(np.float64)
        stale = w - backup[party] if party in backup else np.zeros_like(w)
        mom = momentum * mom - lr * (g + weight_decay * w + lamda * g * g * stale)
        w = w + mom
        backup[party] = w.copy()
    return w


def run_dcasgd(opt, weight, pushes, seeded=()):
    for party in seeded:
        opt.received((0, 0), party, weight)
    w = weight
    for party, grad in pushes:
        w = opt.step((0, 0), w, grad, contributor=party)
    return w


@pytest.mark.parametrize("momentum", [0.0, 0.9])
@pytest.mark.parametrize("seeded", [(), ("dc0", "dc1", "dc2")], ids=["unseeded", "seeded-at-init"])
def test_dcasgd_matches_mxnets_formula_with_per_party_backups(momentum, seeded):
    rng = np.random.default_rng(3)
    weight = rng.standard_normal(50).astype(np.float32)
    pushes = [(party, rng.standard_normal(50).astype(np.float32))
              for party in ["dc0", "dc1", "dc1", "dc0", "dc2", "dc1", "dc0"]]
    opt = DCASGD(lr=0.1, momentum=momentum, lamda=0.5, weight_decay=0.01, rescale_grad=0.5)
    w = run_dcasgd(opt, weight, pushes, seeded)
    expected = dcasgd_reference(weight, pushes, lr=0.1, momentum=momentum, lamda=0.5, weight_decay=0.01,
                                rescale=0.5, seeded=seeded)
    np.testing.assert_allclose(w, expected, rtol=1e-5, atol=1e-6)


def test_dcasgd_compensates_a_partys_first_push_against_the_weights_it_received_at_init():
    """dc1's first push comes after dc0 moved the weights: seeded at INIT, it is compensated by that drift."""
    rng = np.random.default_rng(7)
    weight = rng.standard_normal(20).astype(np.float32)
    g0, g1 = (rng.standard_normal(20).astype(np.float32) * 2 for _ in range(2))
    opt = DCASGD(lr=0.1, lamda=1.0, rescale_grad=1.0)
    for party in ("dc0", "dc1"):
        opt.received((0, 0), party, weight)
    w1 = opt.step((0, 0), weight, g0, contributor="dc0")
    w2 = opt.step((0, 0), w1, g1, contributor="dc1")
    drift = w1.astype(np.float64) - weight
    assert np.abs(drift).min() > 1e-3  # the term below is not trivially zero
    np.testing.assert_allclose(w2, w1 - 0.1 * (g1 + 1.0 * g1 * g1 * drift), rtol=1e-5, atol=1e-6)
    uncompensated = w1 - 0.1 * g1
    assert np.abs(w2 - uncompensated).max() > 1e-3


def test_dcasgd_keeps_weight_decay_out_of_the_curvature_term():
    """MXNet: ``g + wd * w + lamda * g * g * (w - w_bak)``; squaring ``g + wd * w`` instead must not match."""
    weight = np.full(6, 3.0, np.float32)
    backup = np.full(6, 2.0, np.float32)
    g = np.full(6, 0.5, np.float32)
    lr, wd, lamda = 0.1, 0.2, 1.0
    opt = DCASGD(lr=lr, lamda=lamda, weight_decay=wd, rescale_grad=1.0)
    opt.received((0, 0), "dc0", backup)
    got = opt.step((0, 0), weight, g, contributor="dc0")
    raw = weight - lr * (g + wd * weight + lamda * g * g * (weight - backup))             # 3 - 0.1 * 1.35
    decayed = g + wd * weight
    with_wd_inside = weight - lr * (decayed + lamda * decayed * decayed * (weight - backup))  # 3 - 0.1 * 2.31
    np.testing.assert_allclose(got, raw, rtol=1e-6)
    assert np.abs(got - with_wd_inside).min() > 0.05


def test_dcasgd_two_parties_need_one_backup_each():
    """Two parties interleave (dc1 is one push behind). With one backup per key (GeoMX's, i.e. every push
    under contributor "") each push is compensated against the *other* party's last weights; the expected
    weights here are the paper's (one backup per party), and the two differ."""
    rng = np.random.default_rng(11)
    weight = rng.standard_normal(30).astype(np.float32)
    order = ["dc0", "dc0", "dc1", "dc0", "dc1", "dc1", "dc0", "dc1"]
    pushes = [(party, rng.standard_normal(30).astype(np.float32) * 2) for party in order]
    parties = ("dc0", "dc1")
    expected = dcasgd_reference(weight, pushes, lr=0.05, momentum=0.0, lamda=1.0, seeded=parties)
    shared = dcasgd_reference(weight, [("", g) for _, g in pushes], lr=0.05, momentum=0.0, lamda=1.0,
                              seeded=("",))
    assert np.abs(expected - shared).max() > 1e-2  # the test can tell the two apart
    w = run_dcasgd(DCASGD(lr=0.05, lamda=1.0, rescale_grad=1.0), weight, pushes, seeded=parties)
    np.testing.assert_allclose(w, expected, rtol=1e-5, atol=1e-6)


def test_dcasgd_received_replaces_the_backup_after_a_rejoin_or_a_pull():
    """A rejoining party (or one that pulls) holds the current weights: its next push has no staleness."""
    rng = np.random.default_rng(13)
    weight = rng.standard_normal(10).astype(np.float32)
    g = rng.standard_normal(10).astype(np.float32)
    opt = DCASGD(lr=0.1, lamda=1.0, rescale_grad=1.0)
    opt.received((0, 0), "dc1", weight)
    w = opt.step((0, 0), weight, g, contributor="dc0")
    opt.received((0, 0), "dc1", w)
    np.testing.assert_allclose(opt.step((0, 0), w, g, contributor="dc1"), w - 0.1 * g, rtol=1e-6)


def test_outer_optimizer_with_lr_1_and_no_momentum_is_plain_averaging():
    """HFA feeds the outer optimizer -delta; lr 1 without momentum must move the model by exactly delta."""
    rng = np.random.default_rng(5)
    weight = rng.standard_normal(40).astype(np.float32)
    opt = OuterNesterov(lr=1.0, momentum=0.0, rescale_grad=1.0)
    for _ in range(3):
        delta = rng.standard_normal(40).astype(np.float32)
        new = opt.step((0, 0), weight, -delta)
        np.testing.assert_allclose(new, weight + delta, rtol=1e-6, atol=1e-7)
        weight = new


def test_dcasgd_with_one_contributor_is_torch_momentum_sgd():
    """No staleness (a single party): the compensation term is zero every step."""
    weight, grads = random_problem((6, 5), seed=11)
    ours = DCASGD(lr=0.05, momentum=0.9, lamda=0.5, rescale_grad=1.0)
    w = weight.numpy().copy()
    trajectory = []
    for g in grads:
        w = ours.step((0, 0), w, g.numpy(), contributor="dc0")
        trajectory.append(w.copy())
    assert_same_trajectory(trajectory, run_torch(torch.optim.SGD, {"lr": 0.05, "momentum": 0.9}, weight, grads))


# ---------------------------------------------------------------------------------------------------------
# DCAdam: DCASGD's compensation, then torch's Adam


def test_dcadam_is_torch_adam_on_the_gradients_compensated_per_party():
    """Replayed: each push's gradient compensated by hand against its party's backup (the weights it was last
    answered with, INIT's first), then fed to ``torch.optim.Adam``: the same weights at every push."""
    rng = np.random.default_rng(11)
    weight = rng.standard_normal(40).astype(np.float32)
    pushes = [(party, rng.standard_normal(40).astype(np.float32))
              for party in ["dc0", "dc1", "dc1", "dc0", "dc2", "dc1", "dc0"]]
    opt = DCAdam(lr=0.01, lamda=0.5, weight_decay=0.01, rescale_grad=0.5)
    param = torch.nn.Parameter(torch.from_numpy(weight.copy()))
    reference = torch.optim.Adam([param], lr=0.01, weight_decay=0.01)
    backup = {party: weight.copy() for party in ("dc0", "dc1", "dc2")}
    for party in backup:
        opt.received((0, 0), party, weight)
    w = weight
    for party, grad in pushes:
        w = opt.step((0, 0), w, grad, contributor=party)
        g = torch.from_numpy(grad) * 0.5
        held = param.detach().clone()
        param.grad = g + 0.5 * g * g * (held - torch.from_numpy(backup[party]))
        reference.step()
        backup[party] = param.detach().numpy().copy()
        torch.testing.assert_close(torch.from_numpy(w), param.detach())
    assert np.abs(w - run_geomx(Adam(lr=0.01, weight_decay=0.01, rescale_grad=0.5), torch.from_numpy(weight),
                                [torch.from_numpy(g) for _, g in pushes])[-1]).max() > 1e-4  # it compensated


def test_dcadam_with_lamda_0_is_adam_bit_for_bit():
    weight, grads = random_problem((30,), 5)
    ours = run_geomx(DCAdam(lr=0.01, lamda=0.0), weight, grads)
    plain = run_geomx(Adam(lr=0.01), weight, grads)
    for a, b in zip(ours, plain, strict=True):
        assert np.array_equal(a, b)


def test_dcadam_state_keeps_the_backups_and_adams_moments():
    rng = np.random.default_rng(2)
    weight = rng.standard_normal(8).astype(np.float32)
    first = DCAdam(lr=0.01, lamda=0.3)
    first.received((0, 0), "dc1", weight)
    w = first.step((0, 0), weight, rng.standard_normal(8).astype(np.float32), contributor="dc0")
    layout, arrays = first.state()
    second = DCAdam(lr=0.01, lamda=0.3)
    second.load_state(json.loads(json.dumps(layout)), arrays)
    grad = rng.standard_normal(8).astype(np.float32)
    assert np.array_equal(first.step((0, 0), w, grad, contributor="dc1"),
                          second.step((0, 0), w, grad, contributor="dc1"))
