"""A party's LAN tier in the topology, the environment and the launcher's plan: `lan: collective` parties get
torchrun's variables and no local server or scheduler; the global scheduler waits for their ranks."""

from __future__ import annotations

from pathlib import Path

import pytest

from geomx.cluster.scheduler import expected_members
from geomx.config import ConfigError, LanTier, NodeConfig, Role, topology_from_dict, topology_to_dict
from geomx.config.env import lan_from_env, node_config_from_env, torchrun_from_env
from geomx.launch import plan_processes

MIXED = {"parties": {"dc0": {"workers": 2, "lan": "collective"}, "dc1": 3}, "central": "dc0"}


def test_a_party_entry_or_the_links_block_chooses_the_lan_tier() -> None:
    topology = topology_from_dict(MIXED)
    assert topology.collective_parties == ("dc0",)
    assert topology.party("dc1").lan is LanTier.SERVER
    every = topology_from_dict({"parties": {"dc0": 2, "dc1": {"workers": 2, "lan": "server"}},
                                "links": {"lan": "collective"}})
    assert every.collective_parties == ("dc0",)  # a party's own entry wins over links.lan
    assert topology_from_dict(topology_to_dict(topology)).collective_parties == ("dc0",)  # written back


def test_bad_lan_tiers_and_combinations_are_refused_by_name() -> None:
    with pytest.raises(ConfigError, match=r"parties.dc0.lan must be one of \['server', 'collective'\]"):
        topology_from_dict({"parties": {"dc0": {"workers": 2, "lan": "nccl"}}})
    with pytest.raises(ConfigError, match=r"collective LAN tier .* does not combine with a flat parameter server"):
        topology_from_dict({**MIXED, "mode": "flat"})
    with pytest.raises(ConfigError, match="does not combine with DGT"):
        topology_from_dict({**MIXED, "dgt": {"k": 0.5}})
    with pytest.raises(ConfigError, match="GEOMX_LAN must be one of"):
        lan_from_env(topology_from_dict(MIXED), {"GEOMX_LAN": "rdma"})


def test_geomx_lan_sets_every_party() -> None:
    topology = lan_from_env(topology_from_dict(MIXED), {"GEOMX_LAN": "collective"})
    assert topology.collective_parties == ("dc0", "dc1")
    assert lan_from_env(topology, {"GEOMX_LAN": "server"}).collective_parties == ()


def test_torchrun_variables_are_read_whole_or_refused() -> None:
    assert torchrun_from_env({}) is None
    run = torchrun_from_env({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"})
    assert (run.rank, run.world_size, run.local_rank, run.master_addr, run.master_port) == (1, 2, 1, "10.0.0.1",
                                                                                          29500)
    with pytest.raises(ConfigError, match="RANK is set but not MASTER_ADDR, MASTER_PORT"):
        torchrun_from_env({"RANK": "0", "WORLD_SIZE": "2"})
    with pytest.raises(ConfigError, match="RANK=2 is not in WORLD_SIZE=2"):
        torchrun_from_env({"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"})


def test_torchrun_restarts_with_the_agents_shared_store_are_refused_at_the_first_start() -> None:
    """A restarted group would read its first attempt's addresses in the agent's store and fail to connect
    (pytorch/pytorch#135712, seen in test_rejoin's torchrun case): said at once, naming the way out."""
    run = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "29500"}
    with pytest.raises(ConfigError, match="TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"):
        torchrun_from_env({**run, "TORCHELASTIC_MAX_RESTARTS": "1", "TORCHELASTIC_USE_AGENT_STORE": "True"})
    for agent in ({"TORCHELASTIC_MAX_RESTARTS": "1", "TORCHELASTIC_USE_AGENT_STORE": "False"},
                  {"TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_USE_AGENT_STORE": "True"}):
        assert torchrun_from_env({**run, **agent}) is not None


def test_the_launcher_starts_a_collective_party_as_torchrun_would(tmp_path: Path) -> None:
    topology = topology_from_dict(MIXED)
    specs = {s.label: s for s in plan_processes(topology, tmp_path / "t.yaml", ["python", "train.py"], tmp_path)}
    assert "dc0/scheduler" not in specs and "dc0/server" not in specs  # no local tier for the collective party
    assert {"dc1/scheduler", "dc1/server"} <= set(specs)
    ranks = [specs[f"dc0/worker{r}"].env for r in range(2)]
    assert [e["RANK"] for e in ranks] == ["0", "1"] and {e["WORLD_SIZE"] for e in ranks} == {"2"}
    assert ranks[0]["MASTER_PORT"] == ranks[1]["MASTER_PORT"] and "GEOMX_SCHEDULER" not in ranks[0]
    assert "RANK" not in specs["dc1/worker0"].env
    node = node_config_from_env({**ranks[1], "GEOMX_TOPOLOGY": str(_write(tmp_path, topology))})
    assert node.torchrun is not None and node.torchrun.rank == 1 and node.scheduler is None


def test_the_global_scheduler_waits_for_a_collective_partys_ranks() -> None:
    topology = topology_from_dict(MIXED)
    node = NodeConfig(role=Role.GLOBAL_SCHEDULER, party="dc0", topology=topology, global_scheduler="h:1")
    expected = expected_members(node)
    assert expected[(Role.WORKER, "dc0")] == 2 and expected[(Role.LOCAL_SERVER, "dc1")] == 1
    assert (Role.LOCAL_SERVER, "dc0") not in expected


def _write(folder: Path, topology: object) -> Path:
    import yaml

    path = folder / "t.yaml"
    path.write_text(yaml.safe_dump(topology_to_dict(topology)))  # type: ignore[arg-type]
    return path


@pytest.mark.parametrize("lan", ["collective", "server"])
def test_esync_with_fragment_delay_is_refused_at_launch_in_any_party(lan: str) -> None:
    """ESync runs on HFA with K2 = 1, and a fragment's overlap must end before its next global round (below K2):
    no party can run ESync with ``fragment_delay``, and ``geomx launch`` says why before starting anything."""
    from geomx.server.compose import check_plugins

    raw = {"parties": {"dc0": {"workers": 2, "lan": lan}, "dc1": 1}, "hfa": {"k1": 2, "k2": 1},
           "training": {"esync": True, "fragment_delay": 1}}
    topology = topology_from_dict(raw)
    with pytest.raises(ConfigError, match=r"fragment_delay \(1\) must be below HFA's K2 \(1\)"):
        check_plugins(topology.training, topology)
    raw["training"] = {"esync": True}
    topology = topology_from_dict(raw)
    check_plugins(topology.training, topology)  # ESync itself runs in both kinds of party


def test_local_rank_picks_a_ranks_gpu_from_torchrun_or_its_party_rank(monkeypatch) -> None:
    import geomx.torch as gx

    topologies = Path(__file__).resolve().parents[2] / "topologies"
    base = {"GEOMX_TOPOLOGY": str(topologies / "collective.yaml"), "GEOMX_GLOBAL_SCHEDULER": "127.0.0.1:9000"}
    for name, value in {**base, "GEOMX_PARTY": "dc1", "RANK": "1", "LOCAL_RANK": "0", "WORLD_SIZE": "2",
                        "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(name, value)
    assert gx.local_rank() == 0  # torchrun's, not the party rank: one rank per host here
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name)
    for name, value in {"GEOMX_TOPOLOGY": str(topologies / "demo.yaml"), "GEOMX_ROLE": "worker", "GEOMX_RANK": "1",
                        "GEOMX_SCHEDULER": "127.0.0.1:9001"}.items():  # a server party's worker
        monkeypatch.setenv(name, value)
    assert gx.local_rank() == 1


class _StubGroup:
    """One rank of a party whose broadcast delivers what rank 0 sent (``sent``), as torch.distributed would."""

    party = "dc1"
    world_size = 2

    def __init__(self, rank: int, sent: int | None = None) -> None:
        self.rank, self.sent, self.broadcasts = rank, sent, []

    def broadcast(self, tensor, source: int = 0) -> None:
        assert source == 0
        self.broadcasts.append(int(tensor[0]))
        if self.rank != 0:
            tensor[0] = self.sent


def test_rank_0_speaks_for_the_party_and_a_failure_reaches_every_rank_at_once() -> None:
    from geomx.worker.ranks import PartyRanks

    def ranks(group: _StubGroup) -> PartyRanks:
        return PartyRanks(group, central=False, sender=None)  # type: ignore[arg-type]

    first = _StubGroup(0)
    assert ranks(first).first_rank_says(lambda: 7, "the steps") == 7 and first.broadcasts == [7]
    assert ranks(_StubGroup(1, sent=7)).first_rank_says(lambda: pytest.fail("only rank 0 asks"), "the steps") == 7

    def refused() -> int:
        raise RuntimeError("the state server refused")

    first = _StubGroup(0)
    with pytest.raises(RuntimeError, match="the state server refused"):
        ranks(first).first_rank_says(refused, "the steps")
    assert first.broadcasts == [-1], "rank 0 tells the others before it raises"
    with pytest.raises(RuntimeError, match="party dc1: rank 0 failed the steps"):
        ranks(_StubGroup(1, sent=-1)).first_rank_says(refused, "the steps")
