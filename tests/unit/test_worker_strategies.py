"""The PyTorch wrapper's strategies (geomx.core.strategy and each algorithm's strategy.py) against a fake loop and
a recording store, no sockets: what each one pushes and pulls, when, and what the optimizer does."""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace

import pytest
import torch

from geomx.algorithms.esync.strategy import CONTROL_KEY, ESync
from geomx.algorithms.fsa.strategy import LocalOptimizerStep, ServerOptimizerStep
from geomx.algorithms.hfa.strategy import PeriodicAverage
from geomx.algorithms.modes import Lan, Strategy
from geomx.algorithms.registry import STRATEGIES, strategy_class
from geomx.core.strategy import WorkerStrategy


class Store:
    """A worker's store as the strategies use it: pushes recorded, pulls answered from ``answers``."""

    def __init__(self, num_workers: int = 2, num_all_workers: int = 4, k1: int = 3) -> None:
        self.name = "dc0/worker0"
        self.num_workers, self.num_all_workers = num_workers, num_all_workers
        self.hfa = SimpleNamespace(k1=k1, k2=1)
        self.pushes: list[tuple[int, list[float]]] = []
        self.tokens: list[int | None] = []  # each push's reported samples
        self.pulls: list[int] = []
        self.answers: dict[int, torch.Tensor] = {}
        self.inits: list[int] = []
        self.assigned = 5

    def push(self, key: int, value: torch.Tensor, priority: int = 0, tokens: int | None = None) -> None:
        self.pushes.append((key, value.flatten().tolist()))
        self.tokens.append(tokens)

    def pull(self, key: int, out: torch.Tensor, priority: int = 0) -> None:
        self.pulls.append(key)
        out.copy_(self.answers[key])

    def init(self, key: int, value: torch.Tensor) -> None:
        self.inits.append(key)

    def assign_local_steps(self, seconds_per_step: float, base_steps: int) -> int:
        return self.assigned

    def pull_job_model(self, keys: Sequence[int], outs: Sequence[torch.Tensor]) -> None:
        for key, out in zip(keys, outs, strict=True):
            out.copy_(self.answers[key])


class Loop:
    """The wrapper as a strategy sees it (geomx.core.strategy.Loop), with two parameters and SGD (lr 1)."""

    def __init__(self, store: Store) -> None:
        self.kv = store
        self.params = [torch.nn.Parameter(torch.tensor([1.0, 2.0])), torch.nn.Parameter(torch.tensor([4.0]))]
        self.names = ["w", "b"]
        self.trained = [0, 1]
        self.priority = [0, -1]
        self.pending: set[int] = set()
        self.pushed: set[int] = set()
        self.ddp = None
        self.optimizer = torch.optim.SGD(self.params, lr=1.0)
        self.synchronized = 0
        self.warnings: list[str] = []
        self.seconds_waited = 0.0
        self.tokens: int | None = None

    def await_keys(self, keys: Sequence[int]) -> None:
        self.pending.difference_update(keys)

    def synchronize(self) -> None:
        self.synchronized += 1
        self.pending.clear()

    def waited(self, seconds: float) -> None:
        self.seconds_waited += seconds

    def warn_once(self, tag: str, text: str) -> None:
        self.warnings.append(text)

    def update(self) -> None:
        self.optimizer.step()

    def backward(self, *grads: list[float]) -> None:
        for param, grad in zip(self.params, grads, strict=True):
            param.grad = torch.tensor(grad)


def test_the_registry_names_a_strategy_for_every_plan_mode() -> None:
    from geomx.algorithms.fsa.collective import CollectiveLocalStep
    from geomx.algorithms.fsa.sharded import ShardedServerStep
    from geomx.algorithms.hfa.collective import CollectivePeriodicAverage
    from geomx.torch.plan import Strategy as PlanStrategy

    assert PlanStrategy is Strategy  # the plan's mode is the registry's key
    assert set(STRATEGIES) == {(mode, lan) for mode in Strategy for lan in Lan}  # every mode in every LAN tier
    assert strategy_class(Strategy.HFA, Lan.SERVER) is PeriodicAverage
    assert strategy_class(Strategy.ESYNC, Lan.SERVER) is ESync
    assert strategy_class(Strategy.LOCAL, Lan.COLLECTIVE) is CollectiveLocalStep
    assert strategy_class(Strategy.SERVER, Lan.SHARDED) is ShardedServerStep  # FSA from FSDP2's shards
    # HFA (and ESync) average FSDP2's shards with the collective strategy of a whole model
    assert strategy_class(Strategy.HFA, Lan.SHARDED) is CollectivePeriodicAverage
    assert all(issubclass(strategy_class(*pair), WorkerStrategy) for pair in STRATEGIES)
    with pytest.raises(ValueError, match=r"no wrapper strategy for Strategy\.HFA in a DILOCO party"):
        strategy_class(Strategy.HFA, "DILOCO")  # type: ignore[arg-type]


def test_the_server_optimizer_step_pushes_every_gradient_and_zeros_for_a_missing_one() -> None:
    store = Store()
    loop = Loop(store)
    strategy = ServerOptimizerStep(loop)
    assert strategy.pushes_gradients
    strategy.on_gradient(0, torch.tensor([0.5, 0.5]))  # from the autograd hook; parameter 1 had no gradient
    strategy.step()
    assert store.pushes == [(0, [0.5, 0.5]), (1, [0.0])]
    assert loop.pending == {0, 1} and loop.pushed == set()  # the new weights land before the next forward
    assert "'b' had no gradient" in loop.warnings[0]
    assert loop.params[0].tolist() == [1.0, 2.0]  # no local step: the servers run the optimizer


def _local_step_after_backward(sums: dict[int, torch.Tensor]) -> tuple[Store, Loop, LocalOptimizerStep]:
    """A LocalOptimizerStep of one worker of four whose backward pushed gradients of ones; ``sums``: the job's
    gradient sums the servers answer."""
    store = Store(num_all_workers=4)
    store.answers = sums
    loop = Loop(store)
    strategy = LocalOptimizerStep(loop)
    loop.backward([1.0, 1.0], [1.0])
    for key in (0, 1):
        strategy.on_gradient(key, loop.params[key].grad)
    return store, loop, strategy


def test_the_local_optimizer_step_averages_the_sums_into_grad_and_steps_here() -> None:
    store, loop, strategy = _local_step_after_backward({0: torch.tensor([4.0, 8.0]), 1: torch.tensor([2.0])})
    strategy.step()
    assert store.pulls == [0, 1] and loop.pending == set()
    assert loop.params[0].tolist() == [0.0, 0.0] and loop.params[1].tolist() == [3.5]  # SGD on the mean


def test_the_averaged_gradients_can_be_clipped_before_the_step_applies_them() -> None:
    """``average_gradients`` puts the mean into ``.grad`` before ``step``, as DDP leaves it after backward: a clip
    in between is what the optimizer applies. Where the servers run the optimizer, it is refused by name; under
    local SGD the gradients are the worker's own, left as they are."""
    # the mean: [3, 4], norm 5
    store, loop, strategy = _local_step_after_backward({0: torch.tensor([12.0, 16.0]), 1: torch.tensor([0.0])})
    strategy.average_gradients()
    assert loop.params[0].grad.tolist() == [3.0, 4.0] and store.pulls == [0, 1]
    torch.nn.utils.clip_grad_norm_(loop.params, 1.0)  # the mean, scaled to norm 1: [0.6, 0.8]
    strategy.step()
    assert store.pulls == [0, 1], "the step pulls nothing more"
    torch.testing.assert_close(loop.params[0].data, torch.tensor([0.4, 1.2]))
    with pytest.raises(RuntimeError, match="dc0/worker0: the global servers run the optimizer on the gradients"):
        ServerOptimizerStep(Loop(Store())).average_gradients()
    local = Loop(Store())
    local.backward([2.0, 2.0], [2.0])
    PeriodicAverage(local).average_gradients()
    assert local.params[0].grad.tolist() == [2.0, 2.0]


def test_a_periodic_average_steps_locally_and_pushes_its_share_every_k1_steps() -> None:
    store = Store(num_workers=2, k1=3)
    loop = Loop(store)
    strategy = PeriodicAverage(loop)
    assert not strategy.pushes_gradients and strategy.k1 == 3
    for step in range(1, 4):
        loop.backward([1.0, 0.0], [0.0])
        strategy.step()
        assert loop.synchronized == step  # the last average lands before each local step
        assert store.pushes == ([] if step < 3 else [(0, [-1.0, 1.0]), (1, [2.0])])  # weights / workers
    assert loop.pending == {0, 1} and strategy.local_steps == 0
    assert store.tokens == [None, None]  # the script counted no samples: none reported


def test_a_periodic_average_reports_the_samples_counted_since_its_last_sync() -> None:
    """``DistributedOptimizer.step(tokens=n)`` adds to ``loop.tokens``; each sync reports them with every push and
    starts counting again (decoupled HFA rounds weigh the parties by them)."""
    store = Store(num_workers=2, k1=2)
    loop = Loop(store)
    strategy = PeriodicAverage(loop)
    for step, samples in enumerate((8, 8, 5, 3), start=1):
        loop.tokens = (loop.tokens or 0) + samples  # as step(tokens=samples) counts
        loop.backward([0.0, 0.0], [0.0])
        strategy.step()
        if step % 2 == 0:
            assert loop.tokens is None
    assert store.tokens == [16, 16, 8, 8]


def test_esync_adds_the_end_of_data_flag_and_assigned_steps_then_stops_when_a_worker_is_done() -> None:
    store = Store(num_workers=2, k1=2)
    store.answers = {CONTROL_KEY: torch.zeros(1)}
    loop = Loop(store)
    strategy = ESync(loop)
    strategy.init_keys()
    assert store.inits == [CONTROL_KEY]
    for _ in range(2):
        loop.backward([0.0, 0.0], [0.0])
        strategy.step()
    assert store.pushes[-1] == (CONTROL_KEY, [0.0]) and strategy.round_steps == store.assigned
    store.answers[CONTROL_KEY] = torch.ones(1)  # a worker ran out of data: the job's last round is over
    strategy.finish()
    assert store.pushes[-1] == (CONTROL_KEY, [0.5]) and strategy.done  # 1 / workers: this worker is done
    pushes = len(store.pushes)
    strategy.step()
    assert len(store.pushes) == pushes and "ran out of data" in loop.warnings[-1]


def test_the_job_model_is_the_workers_own_under_fsa_and_the_held_global_model_under_hfa() -> None:
    store = Store()
    store.answers = {0: torch.tensor([9.0, 9.0]), 1: torch.tensor([7.0])}
    into = [torch.zeros(2), torch.zeros(1)]
    fsa_loop = Loop(store)
    ServerOptimizerStep(fsa_loop).load_job_model(into)
    assert fsa_loop.synchronized == 1 and [t.tolist() for t in into] == [[1.0, 2.0], [4.0]]
    hfa_loop = Loop(store)
    PeriodicAverage(hfa_loop).load_job_model(into)
    assert [t.tolist() for t in into] == [[9.0, 9.0], [7.0]]
    # this worker's answers land first: at a step that ended a global round the server holds that round's model
    # once they are in (an evaluation there read that round's model or the one before, by timing)
    assert hfa_loop.synchronized == 1


def test_a_resumed_step_is_the_rounds_under_a_synchronous_tier_and_their_mean_under_an_asynchronous_one() -> None:
    """Under MixedSync each party's push is a round of its own: 2 parties at step 10 make 20 rounds (the resumed
    job started at step 20 before)."""
    from geomx.algorithms.registry import sync_policy
    from geomx.config import Mode

    store = Store()
    for kind, mode, step in (("dist_sync", Mode.HIPS, 20), ("dist_async", Mode.HIPS, 10),
                             ("dist_async", Mode.FLAT, 5)):
        store.policy = sync_policy(kind)  # type: ignore[attr-defined]
        store.config = SimpleNamespace(topology=SimpleNamespace(mode=mode, parties=("dc0", "dc1")))  # type: ignore
        assert ServerOptimizerStep(Loop(store)).steps_of(20) == step, (kind, mode)
