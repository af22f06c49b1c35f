"""What a user's walkthrough of the PyTorch wrapper found:

- ``GEOMX_COMPRESSION=bsc:threshold=0.01`` over the digits CNN compressed nothing (every tensor below the default
  ``size_lower_bound`` of 200000) and said nothing of it, yet warned of Adam on bsc's sparse answers;
- a configuration a rank could not start with (a party the topology lacks, more torchrun ranks than its workers)
  was a traceback through ``gx.shard`` per rank; now ``geomx: <message>``, exit code 1;
- a DDP script under a ``lan: server`` topology died in torch's ``init_process_group`` for want of RANK;
  ``gx.init_process_group`` names the tier;
- a misspelt top-level key got the allowed list without "did you mean"; ``request: 2m`` was not a duration.
(The torchrun forms, as real processes: tests/integration/test_torchrun_refusals.py.)
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest
import torch
from torch import nn

import geomx.torch as gx
from geomx.codecs import idle_size_gate
from geomx.config import ConfigError, TrainingSpec, load_topology, parse_duration, topology_from_dict
from geomx.torch import start
from geomx.torch.plan import make_plan
from geomx.zoo.models import DigitsCNN

TOPOLOGIES = Path(__file__).resolve().parents[2] / "topologies"
BSC = {"type": "bsc", "threshold": 0.01}


# -- the size gate -------------------------------------------------------------------------------------------------
def test_a_size_gate_no_tensor_passes_is_named_with_the_largest_tensor_and_the_knob() -> None:
    sizes = [p.numel() for p in DigitsCNN().parameters()]
    assert idle_size_gate(BSC, 200_000, sizes) == (
        "bsc: no tensor reaches size_lower_bound=200000 (largest: 32768 elements); nothing is compressed: lower the "
        "topology's size_lower_bound (or GEOMX_SIZE_LOWER_BOUND) to at most 32768")
    mpq = idle_size_gate({"type": "mpq", "threshold": 0.01}, 200_000, sizes)
    assert mpq is not None and "every tensor travels as fp16, none as bsc" in mpq
    own = idle_size_gate({**BSC, "size_lower_bound": 50_000}, 1000, sizes)  # the spec's own bound wins
    assert own is not None and "size_lower_bound=50000" in own and "the compression spec's size_lower_bound" in own
    for passes in ((BSC, 1000), (BSC, 32768), (BSC, 0), ({"type": "fp16"}, 200_000), ({"type": "bcs"}, 200_000)):
        assert idle_size_gate(*passes, sizes) is None, passes


def _plan_log(caplog: pytest.LogCaptureFixture, optimizer: torch.optim.Optimizer, bound: int | None,
              warn: bool = True) -> str:
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="geomx.torch"):
        make_plan(TrainingSpec(compression=BSC), None, optimizer, warn, bound)
    return caplog.text


def test_the_wrapper_says_bsc_compresses_nothing_instead_of_warning_of_its_sparse_answers(caplog) -> None:
    adam = torch.optim.Adam(DigitsCNN().parameters())
    idle = _plan_log(caplog, adam, 200_000)
    assert "bsc: no tensor reaches size_lower_bound=200000 (largest: 32768 elements)" in idle, idle
    assert "sparse answers" not in idle, idle
    compressed = _plan_log(caplog, adam, 1000)  # the conv and the first linear layer are compressed
    assert "Adam on bsc's sparse answers" in compressed and "no tensor reaches" not in compressed, compressed
    assert _plan_log(caplog, adam, 200_000, warn=False) == ""  # a worker that does not lead its party
    assert "sparse answers" in _plan_log(caplog, adam, None)  # no bound given: the tensors are not checked
    frozen = torch.optim.Adam([nn.Parameter(torch.zeros(10)), nn.Parameter(torch.zeros(300_000), requires_grad=False)])
    assert "(largest: 10 elements)" in _plan_log(caplog, frozen, 200_000)  # a frozen tensor is never sent


# -- configuration errors at the entry points -----------------------------------------------------------------------
def _rank(monkeypatch: pytest.MonkeyPatch, party: str, world: int, topology: str = "collective.yaml") -> None:
    """This process as a torchrun rank of ``party`` under ``topology`` (its variables, as torchrun sets them)."""
    for name, value in {"GEOMX_TOPOLOGY": str(TOPOLOGIES / topology), "GEOMX_PARTY": party, "RANK": "0",
                        "GEOMX_GLOBAL_SCHEDULER": "127.0.0.1:9000", "WORLD_SIZE": str(world), "LOCAL_RANK": "0",
                        "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(name, value)


@pytest.mark.parametrize(("party", "world", "said"), [
    ("dc9", 2, "geomx: GEOMX_PARTY='dc9' is not a party of the topology ['dc0', 'dc1']"),
    ("dc1", 3, "geomx: party dc1 has 2 workers in the topology but torchrun started 3 ranks (WORLD_SIZE=3)"),
])
def test_the_entry_points_say_a_configuration_error_in_one_line(monkeypatch, party, world, said) -> None:
    _rank(monkeypatch, party, world)
    data = list(range(8))
    model = nn.Linear(2, 2)
    for call in (lambda: gx.shard(data), lambda: gx.ShardSampler(data), gx.worker_place, gx.local_rank,
                 lambda: gx.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model),
                 lambda: gx.init_process_group("gloo")):
        with pytest.raises(SystemExit) as exited:
            call()
        assert str(exited.value.code).startswith(said), exited.value.code  # exit status 1, the text on stderr
        assert exited.value.__cause__ is None and exited.value.__suppress_context__


def test_the_kvstore_says_a_bad_setting_in_one_line(monkeypatch) -> None:
    """``geomx.kv.create()`` (the seeds' MXNet-style loops) as the wrapper's entry points: it was a ConfigError
    traceback through the config readers."""
    from geomx import kv

    for name, value in {"GEOMX_TOPOLOGY": str(TOPOLOGIES / "demo.yaml"), "GEOMX_ROLE": "worker", "GEOMX_PARTY": "dc0",
                        "GEOMX_RANK": "0", "GEOMX_GLOBAL_SCHEDULER": "127.0.0.1:9000", "GEOMX_TIMEOUT": "abc"}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exited:
        kv.create()
    assert str(exited.value.code).startswith("geomx: GEOMX_TIMEOUT: cannot read duration 'abc'"), exited.value.code
    assert exited.value.__suppress_context__


def test_a_refused_plan_is_one_line_too_and_the_plan_itself_still_raises() -> None:
    from geomx.config import NodeConfig, Role

    training = TrainingSpec(server_optimizer="translate")
    topology = dataclasses.replace(load_topology(TOPOLOGIES / "demo.yaml"), training=training)
    config = NodeConfig(Role.WORKER, "dc0", topology, "127.0.0.1:1", rank=0)
    model = nn.Linear(2, 2)
    with pytest.raises(SystemExit, match=r"geomx: training\.server_optimizer translate: AdamW has no server twin"):
        gx.DistributedOptimizer(torch.optim.AdamW(model.parameters()), model, config=config)
    with pytest.raises(ConfigError, match="AdamW has no server twin"):  # the function below the entry point
        make_plan(training, None, torch.optim.AdamW(model.parameters()))


# -- a DDP script's process group ------------------------------------------------------------------------------------
def test_init_process_group_names_a_server_tier_and_calls_torch_in_a_collective_one(monkeypatch) -> None:
    calls: list[tuple[object, dict[str, object]]] = []
    monkeypatch.setattr(start.dist, "init_process_group", lambda backend=None, **kw: calls.append((backend, kw)))
    for name, value in {"GEOMX_TOPOLOGY": str(TOPOLOGIES / "demo.yaml"), "GEOMX_ROLE": "worker", "GEOMX_PARTY": "dc1",
                        "GEOMX_RANK": "0", "GEOMX_GLOBAL_SCHEDULER": "127.0.0.1:9000",
                        "GEOMX_SCHEDULER": "127.0.0.1:9001"}.items():  # what geomx launch sets a server party's worker
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exited:
        gx.init_process_group("gloo")
    said = str(exited.value.code)
    assert said.startswith("geomx: this topology's parties are lan: server") and "needs lan: collective" in said
    assert "links: {lan: collective}" in said and "GEOMX_LAN=collective" in said and calls == []
    monkeypatch.setenv("GEOMX_LAN", "collective")  # the fix it names
    monkeypatch.delenv("GEOMX_RANK")
    _rank(monkeypatch, "dc1", 2, "demo.yaml")
    gx.init_process_group("gloo", timeout=None)
    assert calls == [("gloo", {"timeout": None})]


def test_one_server_party_of_a_mixed_topology_is_named_by_itself() -> None:
    from geomx.config import NodeConfig, Role

    topology = topology_from_dict({"parties": {"dc0": {"workers": 2, "lan": "collective"}, "dc1": 2}})
    said = start.collective_refusal(NodeConfig(Role.WORKER, "dc1", topology, "127.0.0.1:1", rank=0))
    assert said is not None and said.startswith("party dc1 is lan: server") and "parties.dc1.lan: collective" in said
    assert start.collective_refusal(NodeConfig(Role.WORKER, "dc0", topology, "127.0.0.1:1")) is None


# -- topology files: did you mean, minutes ---------------------------------------------------------------------------
@pytest.mark.parametrize(("raw", "said"), [
    ({"traning": {"sync": "dist_sync"}}, "topology has unknown fields ['traning'] (did you mean 'training'?); "),
    ({"timeouts": {"shutdwn": "1s"}}, "timeouts has unknown fields ['shutdwn'] (did you mean 'shutdown'?)"),
    ({"hfa": {"k1": 2, "K2": 2}}, "hfa has unknown fields ['K2'] (did you mean 'k2'?)"),
    ({"checkpoint": {"dir": "x", "every_step": 10}}, "(did you mean 'every_steps'?)"),
    ({"links": {"wan": {"latncy": "1ms"}}}, "links.wan has unknown fields ['latncy'] (did you mean 'latency'?)"),
    ({"parties": {"dc0": 2, "dc1": {"wokers": 2}}}, "party 'dc1' has unknown fields ['wokers'] (did you mean "
                                                    "'workers'?)"),
    ({"traning": {}, "hf": {}, "zzz": 1}, "(did you mean 'hfa' for 'hf', 'training' for 'traning'?)"),
])
def test_a_misspelt_key_is_answered_with_did_you_mean_at_every_level(raw, said) -> None:
    with pytest.raises(ConfigError) as refused:
        topology_from_dict({"parties": {"dc0": 2, "dc1": 2}, **raw})
    assert said in str(refused.value), str(refused.value)


def test_durations_read_minutes_and_hours() -> None:
    assert [parse_duration(t) for t in ("2m", "2min", "1.5h", "90s", "2 m")] == [120.0, 120.0, 5400.0, 90.0, 120.0]
    topology = topology_from_dict({"parties": {"dc0": 2}, "timeouts": {"request": "2m", "register": "1h"}})
    assert (topology.timeouts.request_s, topology.timeouts.register_s) == (120.0, 3600.0)
    with pytest.raises(ConfigError, match=r"units us, ms, s, m, h"):
        parse_duration("5 minutes")


def test_a_server_optimizer_parameter_typo_is_refused_before_any_process() -> None:
    """``check_plugins`` (geomx launch's, and every node's at start) builds a named server optimizer from the spec:
    a misspelt parameter was refused only by each worker's wrapper, after the whole job had started."""
    from geomx.server.compose import check_plugins

    training = TrainingSpec(sync="dist_async", server_optimizer="dcadam",
                            server_optimizer_params=(("lamba", 0.1),))
    with pytest.raises(ConfigError, match=r"optimizer 'dcadam' has no parameters \['lamba'\]; valid: .*'lamda'"):
        check_plugins(training)
    check_plugins(dataclasses.replace(training, server_optimizer_params=(("lamda", 0.1),)))


def test_a_training_block_the_servers_would_refuse_is_refused_before_any_process() -> None:
    """DGT (or TSEngine across parties) with a WAN codec in the training block: the servers refused it at the
    wrapper's CONFIGURE, once per worker after the job had started; ``check_plugins`` (geomx launch's) now does."""
    from geomx.server.compose import check_plugins

    topology = load_topology(TOPOLOGIES / "dgt.yaml")
    with pytest.raises(ConfigError, match=r"^training: DGT \(ENABLE_DGT\) does not combine with WAN compression"):
        check_plugins(dataclasses.replace(topology.training, compression={"type": "fp16"}), topology)
    check_plugins(topology.training, topology)
