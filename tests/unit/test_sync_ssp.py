"""Bounded staleness (dist_ssp): the policy and its option (the round table under it: test_core_rounds.py)."""

from __future__ import annotations

import numpy as np
import pytest

from geomx.algorithms.ssp.server import BoundedStaleness
from geomx.config import ConfigError, TrainingSpec
from geomx.server.compose import build_policy, check_plugins


def test_the_policy_bounds_the_lead_and_reads_its_option() -> None:
    ssp = BoundedStaleness(staleness=2)
    assert ssp.may_answer(1) and ssp.may_answer(2) and not ssp.may_answer(3)
    assert not BoundedStaleness(staleness=0).may_answer(1)  # 0: every answer at its round's release, as FSA
    assert ssp.round_complete({"a", "b"}, {"a", "b"}) and not ssp.round_complete({"a"}, {"a", "b"})
    np.testing.assert_array_equal(ssp.rescale(np.array([3.0]), present=3, full=4), [4.0])  # FSA's arithmetic
    assert ssp.needs_server_optimizer and not ssp.synchronous and not ssp.clients_leave_independently
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
    with pytest.raises(ConfigError, match="average models synchronously: training.sync dist_ssp is not"):
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
