"""A script's own DistributedDataParallel in a collective party (``geomx.collective.ddp``): the module it wraps, a
DDP over another group refused, and FSA's comm hook refused where the script set one. One real gloo rank (a
process group of one) in a spawned process; the jobs that train with DDP are in the integration tests. And FSDP1,
refused wherever it wraps part of the model."""

from __future__ import annotations

import multiprocessing
import os
import tempfile
from pathlib import Path


def _rank(store: str, out: multiprocessing.Queue) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    from geomx.collective.ddp import check_group, keep_local, unwrap
    from geomx.collective.group import PartyGroup
    from geomx.config import ConfigError

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    seen: dict[str, object] = {}
    inner = nn.Linear(3, 2)
    ddp = nn.parallel.DistributedDataParallel(inner)
    seen["unwrapped"] = unwrap(ddp) == (inner, ddp) and unwrap(inner) == (inner, None)
    check_group(ddp, PartyGroup("dc1", 0, 1))  # the party's group: accepted
    try:
        check_group(ddp, PartyGroup("dc1", 0, 2))
    except ConfigError as error:
        seen["other group"] = str(error)
    keep_local(ddp, "dc1")
    loss = ddp(torch.ones(1, 3)).sum()
    loss.backward()
    seen["local gradient"] = inner.weight.grad.tolist()  # world of one: the same either way; the hook ran
    seen["hook"] = ddp._get_ddp_logging_data().get("comm_hook")
    try:
        keep_local(ddp, "dc1")  # a hook is there already (here: geomx's own; a script's fp16 hook, say)
    except ConfigError as error:
        seen["second hook"] = str(error)
    seen["server party"] = _refusal_in_a_server_party(nn.parallel.DistributedDataParallel(nn.Linear(3, 2)))
    out.put(seen)
    out.close()
    out.join_thread()
    os._exit(0)  # gloo's threads of a group never destroyed can abort the interpreter's teardown


def _refusal_in_a_server_party(ddp: object) -> str:
    """The wrapper's error for a DDP model in a ``lan: server`` party (a one-worker job's config; the refusal comes
    before the store is asked anything)."""
    from types import SimpleNamespace

    import torch

    from geomx.config import ConfigError, NodeConfig, PartySpec, Role, Topology
    from geomx.torch import DistributedOptimizer

    topology = Topology(parties=(PartySpec("dc0", 1),), central="dc0")
    config = NodeConfig(role=Role.WORKER, party="dc0", topology=topology, global_scheduler="127.0.0.1:1")
    try:
        DistributedOptimizer(torch.optim.SGD(ddp.parameters(), lr=0.1), ddp,  # type: ignore[attr-defined]
                             kv=SimpleNamespace(config=config))  # type: ignore[arg-type]
    except (ConfigError, SystemExit) as error:  # (the wrapper's entry point says it in one line: geomx.torch.start)
        return str(error)
    except Exception as error:  # accepted, then failed on the stub store: no refusal
        return f"not refused ({type(error).__name__}: {error})"
    return "not refused"


def test_a_scripts_ddp_is_unwrapped_checked_against_the_party_and_silenced_once() -> None:
    context = multiprocessing.get_context("spawn")
    results: multiprocessing.Queue = context.Queue()
    with tempfile.TemporaryDirectory() as folder:
        proc = context.Process(target=_rank, args=(str(Path(folder) / "store"), results))
        proc.start()
        seen = results.get(timeout=120)
        proc.join(timeout=60)
    assert seen["unwrapped"]
    assert "party dc1" in seen["other group"] and "1 ranks" in seen["other group"] and "has 2" in seen["other group"]
    assert seen["hook"] == "gradients_stay_local"
    assert seen["local gradient"] == [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]
    assert "party dc1" in seen["second hook"] and "comm hook already" in seen["second hook"]
    assert "party dc0" in seen["server party"] and "lan: server party" in seen["server party"], seen["server party"]


def test_a_model_fsdp1_wraps_is_refused_naming_the_module() -> None:
    """FSDP1's flat parameters are shards that look like whole tensors (the same shape on every rank): the wrapper
    refuses them at start, naming the module, rather than averaging different shards."""
    from torch import nn
    from torch.distributed.fsdp import FullyShardedDataParallel

    from geomx.collective.fsdp import fsdp1_refusal

    wrapped = FullyShardedDataParallel.__new__(FullyShardedDataParallel)  # building one needs an accelerator
    nn.Module.__init__(wrapped)
    refusal = fsdp1_refusal(nn.Sequential(nn.Linear(2, 2), wrapped))
    assert refusal is not None and "module 1 is wrapped in FSDP1" in refusal and "fully_shard" in refusal
    assert fsdp1_refusal(nn.Sequential(nn.Linear(2, 2), nn.ReLU())) is None
