"""DistributedOptimizer's loop logic against an in-process stand-in for the kvstore (one worker, no sockets).

The real multi-process runs are in tests/integration/test_torch_frontend.py; here: the errors a user can hit.
"""

from __future__ import annotations

import dataclasses
from contextlib import nullcontext
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from geomx.config import HFASpec, NodeConfig, PartySpec, Role, Topology, TrainingSpec
from geomx.torch import DistributedOptimizer, ModelMismatchError
from geomx.torch.signature import signature


class OneWorkerStore:
    """What a one-worker job's kvstore answers: a pull returns the last push (the sum over one worker)."""

    def __init__(self, training: TrainingSpec, master_values: dict[int, torch.Tensor] | None = None) -> None:
        topology = Topology(parties=(PartySpec("dc0", 1),), central="dc0", training=training)
        self.config = NodeConfig(role=Role.WORKER, party="dc0", topology=topology, global_scheduler="127.0.0.1:1")
        self.is_master_worker, self.name, self.global_rank = True, "dc0/worker0", 0
        self.num_workers = self.num_all_workers = 1
        self.values: dict[int, torch.Tensor] = {}
        self.master_values = master_values or {}
        self.pushes: list[int] = []
        self.records: list[dict[str, Any]] = []
        self.pulse = SimpleNamespace(note=lambda **fields: None)  # the heartbeats' report of the step (status page)

    def init(self, keys: Any, values: Any) -> None:
        keys, values = (keys, values) if isinstance(keys, list) else ([keys], [values])
        for key, value in zip(keys, values, strict=True):
            if key in self.master_values:
                value.copy_(self.master_values[key])
            self.values[key] = value.detach().clone()

    def push(self, key: int, value: torch.Tensor, priority: int = 0) -> None:
        self.pushes.append(key)
        self.values[key] = value.detach().clone()

    def pull(self, key: int, out: torch.Tensor, priority: int = 0) -> None:
        out.data.copy_(self.values[key])

    def ready(self, key: int) -> bool:
        return True

    def counters(self) -> dict[str, Any]:
        return {}

    def wan_bytes(self) -> int:
        return 0

    def record(self, **metrics: Any) -> None:
        self.records.append(metrics)

    def close(self) -> None:
        pass


def model_and_adam() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    return model, torch.optim.AdamW(model.parameters(), lr=0.01)


def test_a_second_backward_before_step_names_the_parameter():
    model, inner = model_and_adam()
    DistributedOptimizer(inner, model, kv=OneWorkerStore(TrainingSpec()))  # type: ignore[arg-type]
    model(torch.randn(5, 4)).sum().backward()
    with pytest.raises(RuntimeError, match=r"parameter '2\.(weight|bias)' got a second gradient before step"):
        model(torch.randn(5, 4)).sum().backward()


def test_parameters_without_a_gradient_push_zeros_and_the_step_matches_plain_torch():
    """Like DDP, an unused parameter steps on a zero gradient (a no-op for Adam without weight decay)."""
    model, _ = model_and_adam()
    inner = torch.optim.Adam(model.parameters(), lr=0.01)
    reference, _ = model_and_adam()
    reference_inner = torch.optim.Adam(reference.parameters(), lr=0.01)
    store = OneWorkerStore(TrainingSpec(server_optimizer="none"))
    opt = DistributedOptimizer(inner, model, kv=store)  # type: ignore[arg-type]
    x = torch.randn(5, 4)
    for net, optimizer in ((model, opt), (reference, reference_inner)):
        optimizer.zero_grad()
        net[2](torch.relu(x[:, :3])).sum().backward()  # the first layer gets no gradient
        optimizer.step()
    assert sorted(store.pushes) == [0, 1, 2, 3]  # zeros for the unused first layer, FSA needs every key
    for got, want in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(got, want)
    assert store.records[0]["plan"].startswith("local optimizer")


def test_accumulated_and_clipped_gradients_step_as_plain_torch_and_a_late_backward_is_named():
    """Two backwards a step, the first inside ``no_sync()`` (pushed once, their sum), then the averaged gradient
    clipped before the step: the same weights as plain torch doing the same. A backward between
    ``average_gradients()`` and ``step()`` is refused by name."""
    model, _ = model_and_adam()
    reference, _ = model_and_adam()
    store = OneWorkerStore(TrainingSpec(server_optimizer="none"))
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, kv=store)  # type: ignore[arg-type]
    reference_inner = torch.optim.SGD(reference.parameters(), lr=0.1)
    x = torch.randn(2, 5, 4)
    for _ in range(2):
        for net, optimizer in ((model, opt), (reference, reference_inner)):
            optimizer.zero_grad()
            with opt.no_sync() if optimizer is opt else nullcontext():  # plain torch accumulates anyway
                net(x[0]).sum().backward()
            net(x[1]).sum().backward()
            if optimizer is opt:
                opt.average_gradients()
            torch.nn.utils.clip_grad_norm_(net.parameters(), 0.5)
            optimizer.step()
    assert store.pushes == [3, 2, 1, 0] * 2, "each key pushed once a step, deepest first"
    for got, want in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(got, want)
    opt.zero_grad()
    model(x[0]).sum().backward()
    opt.average_gradients()
    with pytest.raises(RuntimeError, match=r"got a gradient after average_gradients\(\) and before step\(\)"):
        model(x[1]).sum().backward()


def test_a_model_that_differs_from_the_masters_fails_before_any_parameter_is_declared():
    model, inner = model_and_adam()
    wider = nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 2))
    from geomx.torch.optimizer import SIGNATURE_KEY

    store = OneWorkerStore(TrainingSpec(), master_values={SIGNATURE_KEY: signature(wider)})
    with pytest.raises(ModelMismatchError, match=r"parameter 0 \('0.weight', shape \(3, 4\)\): 12 elements here, "
                                                 r"20 on the master worker"):
        DistributedOptimizer(inner, model, kv=store)  # type: ignore[arg-type]
    assert list(store.values) == [SIGNATURE_KEY]


def test_wrong_arguments_are_named():
    model, _ = model_and_adam()
    store = OneWorkerStore(TrainingSpec())
    with pytest.raises(TypeError, match=r"wraps a torch\.optim\.Optimizer"):
        DistributedOptimizer(model, model, kv=store)  # type: ignore[arg-type]
    other = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    with pytest.raises(ValueError, match="not one of the model's"):
        DistributedOptimizer(other, model, kv=store)  # type: ignore[arg-type]


@pytest.mark.parametrize("priorities", [True, False])
def test_priorities_follow_the_layers_unless_the_topology_turns_them_off(priorities):
    """``training.priorities: false`` (the frontend bench's control for P3) sends every tensor at priority 0."""

    class PriorityStore(OneWorkerStore):
        def __init__(self, training: TrainingSpec) -> None:
            super().__init__(training)
            self.priorities: dict[int, int] = {}

        def push(self, key: int, value: torch.Tensor, priority: int = 0) -> None:
            self.priorities[key] = priority
            super().push(key, value, priority)

    model, inner = model_and_adam()
    store = PriorityStore(TrainingSpec(p3=True, priorities=priorities))
    opt = DistributedOptimizer(inner, model, kv=store)  # type: ignore[arg-type]
    opt.zero_grad()
    model(torch.randn(5, 4)).sum().backward()
    opt.step()
    # keys 0, 1: the first Linear (layer 0); keys 2, 3: the second (layer 1)
    want = {0: 0, 1: 0, 2: -1, 3: -1} if priorities else {0: 0, 1: 0, 2: 0, 3: 0}
    assert {k: store.priorities[k] for k in range(4)} == want


def test_a_copy_of_the_wrapped_model_is_a_plain_model_and_gets_the_jobs_model():
    """An evaluation copy (deepcopy, or torch.save of the whole model) carries none of the wrapper's hooks."""
    import copy
    import io

    model, inner = model_and_adam()
    store = OneWorkerStore(TrainingSpec(server_optimizer="none"))
    opt = DistributedOptimizer(inner, model, kv=store)  # type: ignore[arg-type]
    twin = copy.deepcopy(model)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    pushes = len(store.pushes)
    twin(torch.randn(5, 4)).sum().backward()  # no hook of the wrapper's fires on the copy
    assert len(store.pushes) == pushes and all(p.grad is not None for p in twin.parameters())
    with torch.no_grad():
        for p in twin.parameters():
            p.zero_()
    opt.load_job_model(twin)  # FSA: every worker holds the job's model
    for got, want in zip(twin.parameters(), model.parameters(), strict=True):
        assert torch.equal(got, want)
    with pytest.raises(ValueError, match="shaped as the wrapped one"):
        opt.load_job_model(nn.Linear(4, 3))


class ServerSGDStore(OneWorkerStore):
    """A one-worker job whose global servers run SGD: a push of a gradient makes the new weights (FSA, SERVER)."""

    def set_optimizer(self, optimizer: Any) -> None:
        self.lr = optimizer.lr

    def set_gradient_compression(self, compression: Any) -> None:
        pass

    def push(self, key: int, value: torch.Tensor, priority: int = 0) -> None:
        self.pushes.append(key)
        self.values[key] = self.values[key] - self.lr * value.detach()


class LocalSGDStore(OneWorkerStore):
    """A one-worker job under HFA (K1 = 2): the party's average of one worker's model is that model."""

    def __init__(self, training: TrainingSpec) -> None:
        super().__init__(training)
        self.hfa = HFASpec(k1=2, k2=1)
        self.config = dataclasses.replace(self.config, topology=dataclasses.replace(self.config.topology, hfa=self.hfa))


STORES = {"fsa-local": lambda: OneWorkerStore(TrainingSpec(server_optimizer="none")),
          "fsa-server": lambda: ServerSGDStore(TrainingSpec(server_optimizer="translate")),
          "hfa": lambda: LocalSGDStore(TrainingSpec())}


def wrapped_sgd(plan: str) -> tuple[nn.Module, DistributedOptimizer, OneWorkerStore]:
    model, _ = model_and_adam()
    store = STORES[plan]()
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, kv=store)  # type: ignore[arg-type]
    return model, opt, store


@pytest.mark.parametrize("change", ["clip", "scale", "replace"])
@pytest.mark.parametrize("plan", ["fsa-local", "fsa-server"])
def test_a_gradient_changed_after_backward_sent_it_is_refused_naming_the_fix(plan, change):
    """Under FSA backward's hooks send each gradient as it is made: a clip, a scaling or a new ``.grad`` before
    ``step()`` would be lost. The gradient's version counter tells; ``step()`` refuses, naming the fix for the plan.
    (Issue 46: clip_grad_norm_(..., 0.01) left a mean gradient norm of 1.62 where SGD's was 0.208.)"""
    model, opt, _ = wrapped_sgd(plan)
    model(torch.randn(5, 4)).sum().backward()
    if change == "clip":
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01)
    elif change == "scale":
        model[0].weight.grad.mul_(0.5)
    else:
        model[0].weight.grad = model[0].weight.grad * 0.5
    fix = ("to the global servers.*would be lost. Set training.server_optimizer: none" if plan == "fsa-server"
           else r"to be averaged.*would be lost. Call opt.average_gradients\(\) after backward")
    with pytest.raises(RuntimeError, match=rf"changed between backward and step\(\), after backward's hooks had sent "
                                           rf"it {fix}"):
        opt.step()


def test_average_gradients_after_a_change_is_refused_too_and_reading_gradients_is_not():
    model, opt, _ = wrapped_sgd("fsa-local")
    model(torch.randn(5, 4)).sum().backward()
    norms = [float(p.grad.norm()) for p in model.parameters()]  # reading changes nothing
    assert all(n > 0 for n in norms)
    opt.step()
    model(torch.randn(5, 4)).sum().backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01)
    with pytest.raises(RuntimeError, match=r"'2\.(weight|bias)' and 3 more changed between backward and "
                                           r"average_gradients\(\)"):
        opt.average_gradients()


@pytest.mark.parametrize("plan", ["fsa-local", "hfa"])
def test_the_fix_or_local_sgd_applies_the_clipped_gradient_as_plain_torch_does(plan):
    """With ``average_gradients()`` first (FSA), or under HFA in a server party, where each step is local SGD's on
    the worker's own gradient, nothing was sent: the clip is applied, the same weights as plain torch's."""
    model, opt, _ = wrapped_sgd(plan)
    reference, _ = model_and_adam()
    reference_inner = torch.optim.SGD(reference.parameters(), lr=0.1)
    x = torch.randn(4, 5, 4)
    for step in range(4):
        for net, optimizer in ((model, opt), (reference, reference_inner)):
            optimizer.zero_grad()
            net(x[step]).sum().backward()
            if optimizer is opt and plan == "fsa-local":
                opt.average_gradients()
            torch.nn.utils.clip_grad_norm_(net.parameters(), 0.01)
            optimizer.step()
    opt.synchronize()
    for got, want in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(got, want)
    assert opt.plan.mode.name == {"fsa-local": "LOCAL", "hfa": "HFA"}[plan]


@pytest.mark.parametrize("plan", ["fsa-local", "fsa-server", "hfa"])
def test_accumulation_without_no_sync_is_refused_under_every_plan_and_no_sync_accumulates(plan):
    """Four micro-batch backwards before a step: refused alike under every plan (HFA would apply the sum, FSA has
    sent the first), naming ``no_sync()``; inside it the step applies the sum, as plain torch's does."""
    model, opt, _ = wrapped_sgd(plan)
    x = torch.randn(4, 5, 4)
    model(x[0]).sum().backward()
    with pytest.raises(RuntimeError, match=r"got a second gradient before step\(\): for gradient accumulation use "
                                           r"`with opt.no_sync\(\):` for the first backwards"):
        model(x[1]).sum().backward()
    model, opt, _ = wrapped_sgd(plan)
    reference, _ = model_and_adam()
    reference_inner = torch.optim.SGD(reference.parameters(), lr=0.1)
    for net, optimizer in ((model, opt), (reference, reference_inner)):
        optimizer.zero_grad()
        with opt.no_sync() if optimizer is opt else nullcontext():
            for micro in x[:3]:
                (net(micro).sum() / 4).backward()
        (net(x[3]).sum() / 4).backward()
        optimizer.step()
    opt.synchronize()
    for got, want in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(got, want)


def test_state_dict_says_where_the_optimizer_state_lives_when_it_is_not_here(caplog):
    """With the optimizer on the global servers the wrapped one never steps: its ``state`` is empty, and the dict
    says where the state is (and a warning, once). Where it steps here, the dict is torch's own."""
    model, opt, _ = wrapped_sgd("fsa-server")
    model(torch.randn(5, 4)).sum().backward()
    opt.step()
    with caplog.at_level("WARNING", logger="geomx.torch"):
        state = opt.state_dict()
        opt.state_dict()
    assert state["state"] == {}
    assert "on the global servers (sgd, which run the optimizer)" in state["geomx"]["optimizer_state"]
    assert "checkpoint: {dir: ..., every_steps: N} in the topology" in state["geomx"]["optimizer_state"]
    assert sum("opt.state_dict(): the optimizer state is on the global servers" in r.message
               for r in caplog.records) == 1
    opt.load_state_dict(state)  # torch's own, the note ignored
    model, _ = model_and_adam()
    local = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    store = OneWorkerStore(TrainingSpec(server_optimizer="none"))
    opt = DistributedOptimizer(local, model, kv=store)  # type: ignore[arg-type]
    model(torch.randn(5, 4)).sum().backward()
    opt.step()
    state = opt.state_dict()
    assert "geomx" not in state and len(state["state"]) == 4  # momentum buffers, here


def test_a_compiled_module_trains_through_the_module_it_wraps():
    """``torch.compile(model)``: the same names as the uncompiled model (a checkpoint's keys do not depend on it),
    the same per-module waits (run eagerly inside the compiled forward), and the same weights as the uncompiled
    model with the optimizer on the global servers (answers landed before the forward that needs them)."""
    finals = []
    for compiled in (False, True):
        model, _ = model_and_adam()
        store = ServerSGDStore(TrainingSpec(server_optimizer="translate"))
        net = torch.compile(model, backend="aot_eager") if compiled else model
        opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), net, kv=store)  # type: ignore[arg-type]
        assert opt.names == ["0.weight", "0.bias", "2.weight", "2.bias"]
        hooked = [m for m in (net, *model.modules()) if m._forward_pre_hooks]
        assert hooked == [model[0], model[2]]
        x = torch.randn(3, 5, 4)
        for step in range(3):
            opt.zero_grad()
            net(x[step]).sum().backward()
            opt.step()
        opt.synchronize()
        finals.append([p.detach().clone() for p in model.parameters()])
    for got, want in zip(*finals, strict=True):
        torch.testing.assert_close(got, want)


def test_the_model_is_digested_for_the_heartbeats_only_where_every_party_holds_the_same_one():
    from geomx.torch.digest import model_digest

    model, inner = model_and_adam()
    store = OneWorkerStore(TrainingSpec())
    noted: list[dict[str, str]] = []
    store.pulse = SimpleNamespace(note=lambda models=None, **fields: models is not None and noted.append(models))
    opt = DistributedOptimizer(inner, model, kv=store)  # type: ignore[arg-type]
    before = model_digest([p.data for p in model.parameters()])
    model(torch.randn(5, 4)).sum().backward()
    opt.step()  # the first step digests the model it starts from: step 0's
    assert noted == [{"0": before}]
    torch.manual_seed(1)
    model = nn.Linear(4, 2)
    store = OneWorkerStore(TrainingSpec(sync="dist_async"))
    store.set_optimizer = lambda spec: None  # type: ignore[attr-defined]
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, kv=store)  # type: ignore[arg-type]
    assert opt.digests is None  # MixedSync: every party trains a model of its own


def test_under_hfa_the_model_is_digested_only_at_the_start_of_a_step_after_a_global_round(monkeypatch):
    """K1 = 2, K2 = 1: steps 0, 2, 4 start from the global model every party holds, 1, 3 from the party's own;
    under streaming no step does."""
    monkeypatch.setattr("geomx.torch.digest.BUDGET", 1e9)  # a digest costs nothing: every step may take one
    model, opt, store = wrapped_sgd("hfa")
    noted: list[dict[str, str]] = []
    store.pulse = SimpleNamespace(note=lambda models=None, **fields: models is not None and noted.append(models))
    assert opt.digests is not None
    opt.digests._interval_s = 0.0  # no heartbeat interval to spread them over
    for _ in range(5):
        opt.zero_grad()
        model(torch.randn(5, 4)).sum().backward()
        opt.step()
    assert sorted(noted[-1], key=int) == ["0", "2", "4"]
    streaming = LocalSGDStore(TrainingSpec(plugin_options=(("fragments", "2"),)))
    streaming.hfa = HFASpec(k1=2, k2=2)
    streaming.config = dataclasses.replace(streaming.config, topology=dataclasses.replace(
        streaming.config.topology, hfa=streaming.hfa))
    assert DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, kv=streaming).digests is None
