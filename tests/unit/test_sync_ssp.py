"""Bounded staleness (dist_ssp): the policy and its option (the round table under it: test_core_rounds.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from geomx import optim
from geomx.algorithms.ssp.server import BoundedStaleness
from geomx.config import ConfigError, Mode, TrainingSpec
from geomx.core.encoding import Encoding
from geomx.core.plugins import Aggregation, Route
from geomx.core.rounds import RoundTable, SliceValue
from geomx.protocol.wire import Kind, Message
from geomx.server.compose import build_policy, check_plugins
from geomx.server.pushpull import PushPulls


def test_the_policy_bounds_the_lead_and_reads_its_option() -> None:
    ssp = BoundedStaleness(staleness=2)
    assert ssp.may_answer(1) and ssp.may_answer(2) and not ssp.may_answer(3)
    assert not BoundedStaleness(staleness=0).may_answer(1)  # 0: every answer at its round's release, as FSA
    assert ssp.round_complete({"a", "b"}, {"a", "b"}) and not ssp.round_complete({"a"}, {"a", "b"})
    np.testing.assert_array_equal(ssp.rescale(np.array([3.0]), present=3, full=4), [4.0])  # FSA's arithmetic
    assert ssp.needs_server_optimizer and not ssp.synchronous
    assert ssp.drops_dead_clients  # a lost party stops nobody (issue 49): dropped, it may rejoin
    assert not ssp.clients_leave_independently  # but shutdown is a round: a finished party's queued pushes join it
    policy = build_policy("dist_ssp", {"staleness": "3"})
    assert isinstance(policy, BoundedStaleness) and policy.staleness == 3
    check_plugins(TrainingSpec(sync="dist_ssp", plugin_options=(("staleness", "1"),)))
    with pytest.raises(ConfigError, match="staleness must be >= 0"):
        check_plugins(TrainingSpec(sync="dist_ssp", plugin_options=(("staleness", "-1"),)))
    with pytest.raises(ConfigError, match=r"unknown fields \['stalenes'\].*dist_ssp takes staleness \(int\)"):
        check_plugins(TrainingSpec(plugin_options=(("stalenes", "1"),)))


def test_the_wrapper_plans_ssp_from_the_policy_s_declared_needs() -> None:
    import torch

    from geomx.config import HFASpec
    from geomx.torch.plan import Strategy, make_plan

    params = [torch.nn.Parameter(torch.zeros(2))]
    plan = make_plan(TrainingSpec(sync="dist_ssp"), None, torch.optim.SGD(params, lr=0.1))
    assert plan.mode is Strategy.SERVER and plan.kvstore_type == "dist_ssp" and plan.server_optimizer is not None
    with pytest.raises(ConfigError, match=r"SSP \(dist_ssp\) answers a party with a model"):
        make_plan(TrainingSpec(sync="dist_ssp"), None, torch.optim.AdamW(params))
    with pytest.raises(ConfigError, match=r"average models synchronously: training\.sync dist_ssp is not"):
        make_plan(TrainingSpec(sync="dist_ssp"), HFASpec(2, 2), torch.optim.SGD(params, lr=0.1))


def test_the_environment_turns_it_on_as_the_issue_says(tmp_path, make_server) -> None:
    from geomx.config import Role, node_config_from_env
    from geomx.server.compose import compose, configured_policy

    env = {"GEOMX_ROLE": "global_server", "GEOMX_PARTY": "dc0", "GEOMX_GLOBAL_SCHEDULER": "127.0.0.1:1",
           "GEOMX_NUM_WORKERS": "1", "GEOMX_NUM_PARTIES": "2", "GEOMX_RANK": "0",
           "GEOMX_SYNC": "dist_ssp", "GEOMX_STALENESS": "3"}
    config = node_config_from_env(env)
    assert config.role is Role.GLOBAL_SERVER and config.topology.training.sync == "dist_ssp"
    assert dict(config.topology.training.plugin_options) == {"staleness": "3"}
    compose(config, make_server("gs", ["ls0", "ls1"]))  # the job's options pass the root's check
    policy = configured_policy("dist_ssp", dict(config.topology.training.plugin_options))  # the master's CONFIGURE
    assert isinstance(policy, BoundedStaleness) and policy.staleness == 3


def ssp_global_server(make_server: Any) -> Any:
    """A global server of two parties under SSP (staleness 1) with SGD (lr 1), answering through the real
    PushPulls (the unit tests' fake host records what it sends)."""
    server = make_server("gs", ["a", "b"])
    server.table = RoundTable(server, server.clients, BoundedStaleness(1))
    server.stored = {(0, 0): SliceValue(np.array([10.0, 10.0], dtype=np.float32))}
    server.is_global = True
    server.optimizer = optim.SGD(lr=1.0)
    server.aggregation = Aggregation()
    server.encoding = Encoding()
    server.route = Route()
    server.checkpoints = None
    server.config = SimpleNamespace(num_workers=1, topology=SimpleNamespace(num_all_workers=2, mode=Mode.HIPS,
                                                                     early_answers=True))
    server.van = SimpleNamespace(peer_party=lambda client: None)
    pushpulls = PushPulls(server)
    server.answer_early, server.complete = pushpulls.answer_early, pushpulls.complete
    server.push = lambda client, request_id, gradient: pushpulls.on_pushpull(Message(
        Kind.PUSHPULL, key=0, slice=0, num_slices=1, sender=client.encode(), request_id=request_id,
        tensor=np.array(gradient, dtype=np.float32), dtype=np.dtype(np.float32), shape=(2,)))
    server.answers = lambda client: [(m.request_id, m.tensor.tolist()) for peer, m in server.sent if peer == client]
    return server


def test_an_early_answer_carries_the_last_applied_model_without_the_open_rounds(make_server: Any) -> None:
    """SSP's promise about values: an early answer is the model as last applied, with neither the early party's
    own pending gradient nor the open round's others; the round, once complete, applies every push once."""
    server = ssp_global_server(make_server)
    server.push("a", 1, [1.0, 2.0])  # round 0 waits for b: a may run one round ahead
    assert server.answers("a") == [(1, [10.0, 10.0])]  # the initial model: a's own gradient is not in it
    server.push("a", 2, [4.0, 4.0])  # round 1: two ahead of the last completed round: it waits
    assert server.answers("a") == [(1, [10.0, 10.0])]
    server.push("b", 1, [3.0, 2.0])  # round 0 completes: 10 - (1 + 3), 10 - (2 + 2); a's round-1 push joins
    assert server.answers("b") == [(1, [6.0, 6.0])]
    assert server.answers("a") == [(1, [10.0, 10.0]), (2, [6.0, 6.0])]  # early again: round 0 applied, not 1
    server.push("b", 2, [0.0, 2.0])  # round 1 completes: 6 - 4, 6 - 6
    assert server.answers("b") == [(1, [6.0, 6.0]), (2, [2.0, 0.0])]
    assert server.stored[(0, 0)].value.tolist() == [2.0, 0.0]
