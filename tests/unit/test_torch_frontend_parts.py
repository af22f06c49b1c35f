"""The front end's pure parts: the plan chosen from the configuration, the model fingerprint, the shards."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from geomx import optim
from geomx.algorithms.registry import check_names
from geomx.config import ConfigError, HFASpec, TrainingSpec
from geomx.torch import FrozenVarianceAdam, Strategy, make_plan, translate
from geomx.torch.data import shard_indices
from geomx.torch.hooks import layer_of_params
from geomx.torch.plan import keeps_residuals
from geomx.torch.signature import compare, signature


def params() -> list[nn.Parameter]:
    return list(nn.Linear(3, 2).parameters())


def test_torch_sgd_and_adam_translate_to_the_same_server_arithmetic():
    sgd = translate(torch.optim.SGD(params(), lr=0.1, momentum=0.9, weight_decay=1e-4, nesterov=True))
    assert sgd == optim.SGD(lr=0.1, momentum=0.9, weight_decay=1e-4, nesterov=True)
    adam = translate(torch.optim.Adam(params(), lr=1e-3, betas=(0.8, 0.99), eps=1e-6))
    assert adam == optim.Adam(lr=1e-3, beta1=0.8, beta2=0.99, epsilon=1e-6)
    assert translate(torch.optim.AdamW(params(), lr=1e-3)) is None
    assert translate(torch.optim.Adam(params(), amsgrad=True)) is None
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    groups = [{"params": model[0].parameters(), "lr": 0.1}, {"params": model[1].parameters(), "lr": 0.2}]
    assert translate(torch.optim.SGD(groups)) is None  # two learning rates cannot run as one server optimizer


def test_plans_follow_the_configuration():
    adam = torch.optim.Adam(params(), lr=1e-3)
    # FSA: every worker steps on the mean gradient, as DDP (the global server's answer stays a plain sum)
    assert make_plan(TrainingSpec(), None, adam).mode is Strategy.LOCAL
    assert make_plan(TrainingSpec(server_optimizer="none"), None, adam).mode is Strategy.LOCAL
    assert make_plan(TrainingSpec(), None, torch.optim.AdamW(params())).mode is Strategy.LOCAL
    translated = make_plan(TrainingSpec(server_optimizer="translate"), None, adam)
    assert translated.mode is Strategy.SERVER and translated.server_optimizer == optim.Adam(lr=1e-3)
    with pytest.raises(ConfigError, match="translate: AdamW has no server twin"):
        make_plan(TrainingSpec(server_optimizer="translate"), None, torch.optim.AdamW(params()))
    # a policy that answers with models needs the optimizer on the servers: translated where it can be
    mixed = make_plan(TrainingSpec(sync="dist_async"), None, adam)
    assert mixed.mode is Strategy.SERVER and mixed.server_optimizer == optim.Adam(lr=1e-3)
    # P3's overlap lands answers lazily, which only weights allow: translated too
    assert make_plan(TrainingSpec(p3=True), None, adam).mode is Strategy.SERVER
    bsc = make_plan(TrainingSpec(compression={"type": "bsc", "threshold": 0.01}), None, adam)
    assert bsc.mode is Strategy.LOCAL and bsc.server_optimizer is None
    dcasgd = make_plan(TrainingSpec(sync="dist_async", server_optimizer="dcasgd",
                                    server_optimizer_params=(("lamda", 0.1),)), None, adam)
    assert dcasgd.mode is Strategy.SERVER and dcasgd.server_optimizer == optim.DCASGD(lr=1e-3, lamda=0.1)
    hfa = make_plan(TrainingSpec(server_optimizer="outer_nesterov"), HFASpec(4, 5), adam)
    assert hfa.mode is Strategy.HFA and hfa.server_optimizer == optim.OuterNesterov()
    assert make_plan(TrainingSpec(esync=True), HFASpec(4, 1), adam).mode is Strategy.ESYNC
    assert make_plan(TrainingSpec(p3=True), None, adam).p3


@pytest.mark.parametrize(("compression", "residual"), [
    ({"type": "bsc", "threshold": 0.01}, True), ({"type": "mpq"}, True),
    ({"type": "error_feedback", "inner": {"type": "int8"}}, True), ({"type": "int8"}, False),
    ({"type": "fp16"}, False), (None, False), ({"type": "nope"}, False),
])
def test_which_codecs_need_additive_data_comes_from_the_codec_registry(compression, residual):
    assert keeps_residuals(compression) is residual
    adam = torch.optim.Adam(params(), lr=1e-3)
    if compression == {"type": "nope"}:
        return
    translated = TrainingSpec(compression=compression, server_optimizer="translate")
    if residual:  # a residual codec cannot carry the weights a server optimizer answers with
        with pytest.raises(ConfigError, match="keeps residuals"):
            make_plan(translated, None, adam)
        assert make_plan(TrainingSpec(compression=compression), None, adam).mode is Strategy.LOCAL
    else:
        assert make_plan(translated, None, adam).mode is Strategy.SERVER


@pytest.mark.parametrize(("spec", "hfa", "text"), [
    (TrainingSpec(sync="dist_async", server_optimizer="none"), None, "MixedSync"),
    (TrainingSpec(compression={"type": "bsc"}, server_optimizer="sgd"), None, "keeps residuals"),
    (TrainingSpec(esync=True), HFASpec(4, 5), "K2 = 1"),
    (TrainingSpec(server_optimizer="outer_nesterov"), None, "needs HFA"),
    (TrainingSpec(server_optimizer="dcasgd"), HFASpec(2, 2), "model deltas"),
    (TrainingSpec(sync="dist_async"), HFASpec(2, 2), "synchronously"),
])
def test_impossible_combinations_fail_with_a_reason(spec, hfa, text):
    with pytest.raises(ConfigError, match=text):
        make_plan(spec, hfa, torch.optim.SGD(params(), lr=0.1) if "MixedSync" not in text
                  else torch.optim.AdamW(params()))


def test_the_fingerprint_names_the_first_differing_parameter():
    a = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    b = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    assert compare(signature(a), signature(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))), a) is None
    text = compare(signature(a), signature(b), a)
    assert text is not None and "parameter 2 ('2.weight', shape (2, 8)): 16 elements here, 24 on the master" in text
    square = nn.Linear(4, 8, bias=False)
    transposed = nn.Linear(8, 4, bias=False)  # the same number of elements, another shape
    assert "beyond the sizes" in str(compare(signature(transposed), signature(square), transposed))


def test_shards_are_equal_disjoint_where_possible_and_cover_everything():
    shards = [shard_indices(10, r, 4, seed=3) for r in range(4)]
    assert {len(s) for s in shards} == {3}
    assert set().union(*shards) == set(range(10))
    assert shard_indices(10, 1, 4, seed=3) == shards[1]  # the same on every worker
    assert sorted(i for s in [shard_indices(8, r, 4) for r in range(4)] for i in s) == list(range(8))
    assert len(shard_indices(2, 4, 5)) == 1  # fewer samples than workers: padded by wrapping around
    with pytest.raises(ValueError, match="outside"):
        shard_indices(10, 4, 4)


def test_layers_are_numbered_in_definition_order_and_modules_wait_for_their_subtree():
    model = nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 2), nn.TransformerEncoderLayer(4, 2, 8))
    model[1].weight = nn.Parameter(torch.zeros(2, 3))
    params = list(model.parameters())
    layers, waits = layer_of_params(model, params)
    assert layers[:4] == [0, 0, 1, 1] and layers[4] == 2  # then the attention's in_proj, out_proj ...
    assert model not in waits  # the root Sequential owns nothing itself
    attention = model[2]
    # the encoder layer waits for everything under it (its fused path never calls its children) ...
    assert waits[attention] == list(range(4, len(params)))
    # ... and the attention for its out_proj too (it uses out_proj.weight without calling out_proj)
    out_proj = next(i for i, p in enumerate(params) if p is attention.self_attn.out_proj.weight)
    assert out_proj in waits[attention.self_attn]


def test_the_training_block_and_its_environment_variables():
    from geomx.config import node_config_from_env, topology_from_dict
    from geomx.server.compose import check_plugins

    topology = topology_from_dict({"parties": {"dc0": 1}, "training": {
        "sync": "dist_async", "server_optimizer": {"type": "dcasgd", "lr": 0.05, "momentum": 0.9},
        "compression": "bsc:threshold=0.01", "p3": True, "metrics_every": 5}})
    spec = topology.training
    assert (spec.sync, spec.server_optimizer, dict(spec.server_optimizer_params)) == \
        ("dist_async", "dcasgd", {"lr": 0.05, "momentum": 0.9})
    assert spec.compression == {"type": "bsc", "threshold": 0.01} and spec.p3 and spec.metrics_every == 5
    env = {"GEOMX_ROLE": "worker", "GEOMX_PARTY": "dc0", "GEOMX_GLOBAL_SCHEDULER": "127.0.0.1:1",
           "GEOMX_SCHEDULER": "127.0.0.1:2", "ENABLE_P3": "1", "GEOMX_P3_SLICE_ELEMS": "1000",
           "GEOMX_SERVER_OPTIMIZER": "outer_nesterov", "GEOMX_COMPRESSION": '{"type": "fp16"}', "GEOMX_ESYNC": "0"}
    node = node_config_from_env(env)
    assert node.topology.training.p3 and node.topology.slice_elems == 1000  # P3 slices every tensor
    assert node.topology.training.server_optimizer == "outer_nesterov"
    assert node.topology.training.compression == {"type": "fp16"}
    for bad, text in [({"training": {"sync": "dist bogus"}}, "sync"), ({"training": {"p3": "yes"}}, "p3 must be"),
                      ({"training": {"colour": 1}}, "unknown fields"),
                      ({"training": {"compression": "bsc:threshold"}}, "not key=value")]:
        with pytest.raises(ConfigError, match=text):  # the sync name and plug-in options: the composition root's
            check_plugins(topology_from_dict({"parties": {"dc0": 1}, **bad}).training)
    # a name no registry holds: refused where the registries are reachable (`geomx launch`, the plan), not by
    # the config layer, which imports no plug-in; the valid names come from the registries
    for bad, text in [({"sync": "dist_bogus"}, r"training\.sync 'dist_bogus' is unknown; valid: \['dist_async', "),
                      ({"server_optimizer": "lion"}, r"server_optimizer 'lion' is unknown; valid: \['auto', 'none', "
                                                     r"'translate', 'adam', 'dcadam', 'dcasgd', 'outer_nesterov', "
                                                     r"'sgd'\]")]:
        training = topology_from_dict({"parties": {"dc0": 1}, "training": bad}).training
        with pytest.raises(ConfigError, match=text):
            check_names(training)
        with pytest.raises(ConfigError, match=text):
            make_plan(training, None, torch.optim.SGD(params(), lr=0.1))
    with pytest.raises(ConfigError, match="ENABLE_P3 must be 0 or 1"):
        node_config_from_env({**env, "ENABLE_P3": "maybe"})
    assert spec.priorities and node.topology.training.priorities  # on unless turned off
    assert not topology_from_dict({"parties": {"dc0": 1}, "training": {"priorities": False}}).training.priorities
    assert not node_config_from_env({**env, "GEOMX_PRIORITIES": "0"}).topology.training.priorities
    with pytest.raises(ConfigError, match=r"training\.priorities must be bool"):
        topology_from_dict({"parties": {"dc0": 1}, "training": {"priorities": "off"}})


def test_the_sampler_reshuffles_per_epoch_and_matches_the_shards():
    from geomx.torch import ShardSampler

    sampler = ShardSampler(list(range(10)), rank=1, num_workers=3, seed=4)
    first = list(sampler)
    sampler.set_epoch(1)
    second = list(sampler)
    assert len(first) == len(second) == len(sampler) == 4
    assert first != second
    assert sorted(i for r in range(3) for i in ShardSampler(list(range(9)), rank=r, num_workers=3,
                                                             shuffle=False)) == list(range(9))


def test_the_recorder_averages_losses_per_interval_and_writes_evaluations_apart():
    from geomx.torch.metrics import StepRecorder

    class Store:
        is_master_worker = False

        def __init__(self) -> None:
            self.records: list[dict] = []
            self.progress: list[tuple[int, float]] = []

        def counters(self) -> dict:
            return {"lan": {"sent": 5, "recv": 7}, "wan": {"sent": 0, "recv": 0}}

        def wan_bytes(self) -> int:
            return 0

        def record(self, **metrics) -> None:
            self.records.append(metrics)

        @property
        def pulse(self):  # the heartbeats' notes
            return self

        def note(self, *, step=None, busy=None) -> None:
            self.progress.append((step, busy))

    store = Store()
    recorder = StepRecorder(store, every=2)
    for loss in (1.0, 3.0, 10.0, 20.0):
        recorder.log(loss=torch.tensor(loss))
        if loss == 10.0:
            recorder.log(accuracy=0.5)  # an evaluation mid-interval does not cut the loss average
        recorder.step()
    recorder.close()
    shown = [{k: r[k] for k in ("step", "loss", "accuracy", "lan_bytes") if k in r} for r in store.records]
    assert shown == [{"step": 2, "loss": 2.0, "lan_bytes": 12}, {"step": 2, "accuracy": 0.5, "lan_bytes": 12},
                     {"step": 4, "loss": 15.0, "lan_bytes": 12}]
    # every step is noted for the heartbeats (the status page): the step count and a busy share in 0..1
    assert [step for step, _ in store.progress] == [1, 2, 3, 4]
    assert all(0.0 <= busy <= 1.0 for _, busy in store.progress)


def test_adam_on_a_sparse_codec_s_answers_is_warned_about_and_frozen_variance_adam_is_not(caplog):
    bsc = TrainingSpec(compression={"type": "bsc", "threshold": 0.01})
    with caplog.at_level(logging.WARNING, logger="geomx.torch"):
        make_plan(bsc, None, torch.optim.AdamW(params()))
    assert "FrozenVarianceAdam" in caplog.text and "AdamW on bsc" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="geomx.torch"):
        make_plan(bsc, None, FrozenVarianceAdam(params(), freeze_after=10))
        make_plan(bsc, None, torch.optim.SGD(params(), lr=0.1))
        make_plan(TrainingSpec(compression={"type": "fp16"}), None, torch.optim.Adam(params()))
        make_plan(bsc, None, torch.optim.AdamW(params()), warn=False)  # a worker that does not lead its party
    assert "FrozenVarianceAdam" not in caplog.text


def test_a_party_speaks_through_its_first_rank_or_the_jobs_master() -> None:
    """``leads_party``: rank 0 of a party (a server party's worker rank, or torchrun's in a collective party), or
    the job's master worker; a worker without a rank (its own launch) speaks too, rather than nobody."""
    from pathlib import Path

    from geomx.config import NodeConfig, Role, TorchRun, load_topology
    from geomx.torch.plan import leads_party

    topology = load_topology(Path(__file__).parents[2] / "topologies" / "demo.yaml")

    def node(rank, master=False, torchrun_rank=None):
        run = None if torchrun_rank is None else TorchRun(rank=torchrun_rank, world_size=2, local_rank=torchrun_rank,
                                                          local_world_size=2, master_addr="127.0.0.1", master_port=1)
        return NodeConfig(Role.WORKER, "dc1", topology, "127.0.0.1:1", rank=rank, is_master=master, torchrun=run)

    assert leads_party(node(0)) and leads_party(node(None)) and leads_party(node(3, master=True))
    assert not leads_party(node(1)) and leads_party(node(None, torchrun_rank=0))
    assert not leads_party(node(None, torchrun_rank=1))
