"""``PartyGroup`` over a group without a CPU backend (a torchrun script's ``init_process_group("nccl")``): the
few CPU tensors a party agrees on (the model's signature at INIT, rank 0's word, ESync's flag) go through the
rank's device and back; over gloo, or a group with a CPU backend, they go as they are."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

from geomx.collective.group import PartyGroup


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A stand-in for torch.distributed's state: the backend the script chose, and every collective's tensor."""
    state: dict[str, Any] = {"config": "cuda:nccl", "seen": []}
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: state["config"].split(":")[-1])
    monkeypatch.setattr(dist, "get_backend_config", lambda group=None: state["config"])

    def collective(tensor: torch.Tensor, **_: Any) -> None:
        state["seen"].append(tensor)
        tensor.add_(1)  # what the peers' values would change

    monkeypatch.setattr(dist, "broadcast", collective)
    monkeypatch.setattr(dist, "all_reduce", collective)
    return state


@pytest.mark.parametrize(("config", "staged"), [("cuda:nccl", True), ("cpu:gloo,cuda:nccl", False),
                                                ("cpu:gloo,cuda:gloo", False)])
def test_cpu_tensors_go_through_the_device_only_where_the_group_has_no_cpu_backend(backend, config, staged) -> None:
    backend["config"] = config
    group = PartyGroup("dc1", rank=0, world_size=2)
    assert group.stage_cpu is staged
    group.stage_device = torch.device("cpu") if staged else None  # no GPU here: a copy on the CPU stands for it
    signature = torch.zeros(4, dtype=torch.float64)
    group.broadcast(signature)
    group.all_reduce(signature[1:3])  # a view: the collective's result lands in it
    assert [t.data_ptr() != signature.data_ptr() for t in backend["seen"][:1]] == [staged]  # a copy, or the tensor
    assert signature.tolist() == [1.0, 2.0, 2.0, 1.0]  # the results came back either way
