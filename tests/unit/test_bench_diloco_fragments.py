"""The DiLoCo bench worker's streaming parts: its fragments (modules, balanced by size) and the job's model it
evaluates (every fragment's global parameters), without torchft or sockets."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from geomx.bench.wan import job as wan_job
from geomx.bench.workers.diloco import fragments_of, load_global_model


def test_the_mlps_modules_make_two_fragments_by_size() -> None:
    model = wan_job.make_model()
    linears = [m for m in model if isinstance(m, torch.nn.Linear)]  # 64x1024, 1024x1024, 1024x10
    first, second = fragments_of(model, 2)
    assert list(first) == [linears[1]] and list(second) == [linears[0], linears[2]]
    assert {id(p) for p in first.parameters()} | {id(p) for p in second.parameters()} == {
        id(p) for p in model.parameters()}


def test_the_evaluated_model_is_every_fragments_global_parameters() -> None:
    model = wan_job.make_model(hidden=8)
    fragments = fragments_of(model, 2)
    # what torchft keeps per fragment: the global model its last outer step made, by the fragment's own names
    diloco = SimpleNamespace(_fragments=[
        SimpleNamespace(_model_fragment=fragment, original_parameters={
            name: torch.full_like(p, float(index + 1)) for name, p in fragment.named_parameters()})
        for index, fragment in enumerate(fragments)])
    held = wan_job.make_model(hidden=8)
    load_global_model(diloco, model, held)
    owner = {id(p): index for index, fragment in enumerate(fragments) for p in fragment.parameters()}
    for (name, param), (_, got) in zip(model.named_parameters(), held.named_parameters(), strict=True):
        assert torch.equal(got, torch.full_like(param, float(owner[id(param)] + 1))), name
