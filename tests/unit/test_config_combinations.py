"""The one "does not combine" table (geomx.config.combinations): every row fires on its two facts, and only then.

The callers' refusals (topology, CONFIGURE, the torch wrapper's plan) are tested where they are raised:
test_sched_config.py, test_torch_frontend_parts.py, tests/integration/test_sched_refusals.py; the rows they
do not reach are driven through their real callers here.
"""

from __future__ import annotations

import pytest
import torch

from geomx.config import ConfigError, HFASpec, TrainingSpec, topology_from_dict
from geomx.config.combinations import RULES, check, configure_facts, plan_facts, refusal
from geomx.torch.plan import make_plan

VALUES = {"server_optimizer": "adam", "codec": "bsc", "why": "AdamW cannot be translated", "sync": "dist_ssp",
          "synchronous": ["dist_sync"], "policy": "SSP"}
BASE = {"parties": {"dc0": {"workers": 1}, "dc1": {"workers": 1}}}


@pytest.mark.parametrize("rule", RULES, ids=lambda r: f"{r.feature}+{r.other}")
def test_every_row_fires_on_its_two_facts_and_only_on_both(rule):
    text = refusal({rule.feature: True, rule.other: True}, **VALUES)
    assert text == rule.text.format(**VALUES)
    assert "{" not in text.replace("{k1", "").replace("{{", "")  # every blank filled
    assert refusal({rule.feature: True, rule.other: False}, **VALUES) is None
    assert refusal({rule.feature: True}, **VALUES) is None  # a fact the caller does not know never fires
    with pytest.raises(ConfigError) as info:
        check({rule.feature: True, rule.other: True}, **VALUES)
    assert str(info.value) == text


def test_rows_are_distinct_pairs_and_say_what_to_do_instead():
    pairs = [(r.feature, r.other) for r in RULES]
    assert len(set(pairs)) == len(pairs)
    assert all(r.instead for r in RULES)


def test_a_valid_topology_breaks_no_row():
    topology = topology_from_dict({**BASE, "dgt": True, "tsengine": {"inter": False, "intra": True}})
    assert refusal(topology.features) is None
    assert topology.features == {"flat": False, "hfa": False, "fp16": False, "security": False, "dgt": True,
                                 "inter_ts": False, "intra_ts": True, "collective": False}


def test_tsengine_refuses_fp16_through_the_topology():
    with pytest.raises(ConfigError, match=r"TSEngine \(ENABLE_INTER_TS\) does not combine with the fp16 switch"):
        topology_from_dict({**BASE, "fp16": True, "tsengine": True})


@pytest.mark.parametrize(("topology", "compression", "other_sync", "expected"), [
    ({"tsengine": True}, True, False, "TSEngine (ENABLE_INTER_TS) works with dist_sync and without WAN compression"),
    ({"tsengine": True}, False, True, "TSEngine (ENABLE_INTER_TS) works with dist_sync and without WAN compression"),
    ({"dgt": True}, True, False, "DGT (ENABLE_DGT) does not combine with WAN compression"),
    ({"dgt": True}, False, True, None),  # DGT takes MixedSync
    ({}, True, True, None),
])
def test_configure_rows(topology, compression, other_sync, expected):
    features = topology_from_dict({**BASE, **topology}).features
    text = refusal(configure_facts(features, compression=compression, other_sync=other_sync))
    assert (text and text.removesuffix("; see docs/algorithms.md, 'Which features combine'")) == expected


def test_the_plan_checks_before_and_after_translating_the_torch_optimizer():
    params = [torch.nn.Parameter(torch.zeros(2))]
    facts = plan_facts(TrainingSpec(sync="dist_async"), None, residual_codec=False, synchronous=False,
                       applies_on_server=True)
    assert refusal(facts) is None  # whether a server optimizer exists is known only after translation
    with pytest.raises(ConfigError, match="AdamW with these settings cannot be translated"):
        make_plan(TrainingSpec(sync="dist_async"), None, torch.optim.AdamW(params))
    # the same refusal names its cause: the user's none, a residual codec (it read "Adam ... cannot be translated
    # (SGD and Adam can)" for both, contradicting itself)
    with pytest.raises(ConfigError, match=r"but training\.server_optimizer is none: set it"):
        make_plan(TrainingSpec(sync="dist_async", server_optimizer="none"), None, torch.optim.Adam(params))
    with pytest.raises(ConfigError, match="but codec 'bsc' keeps residuals, which need additive answers") as refused:
        make_plan(TrainingSpec(sync="dist_async", compression={"type": "bsc"}), None, torch.optim.Adam(params))
    assert "cannot be translated" not in str(refused.value)
    # HFA with a residual codec and an outer optimizer: the plan returns before the after-translation rows
    plan = make_plan(TrainingSpec(compression={"type": "bsc"}, server_optimizer="sgd"), HFASpec(2, 2),
                     torch.optim.SGD(params, lr=0.1))
    assert plan.server_optimizer is not None
