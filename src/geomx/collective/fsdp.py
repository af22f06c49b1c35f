"""Which part of each parameter a rank of a collective party holds when the script sharded its model with FSDP2
(``torch.distributed.fsdp.fully_shard``): a ``LocalShards``, and the check that the sharding is one geomx can sync.

FSDP2 shards every parameter on dim 0 over the party's ranks, as ``torch.chunk`` cuts it: with ``rows`` rows and
``n`` ranks, each rank holds ``ceil(rows / n)`` rows but the last ones (some may hold none). A parameter's rows
are contiguous in its flattened tensor, so a rank's local shard is one flat range ``[start, stop)`` of it; every
rank computes every rank's ranges from the global shapes alone, without talking. geomx syncs exactly this form:
parameters that are DTensors with the single placement ``Shard(0)`` on a 1-D mesh of the party's ranks. Anything
else (``Shard(1)`` from a ``shard_placement_fn``, ``Replicate``, a 2-D mesh for HSDP or tensor parallelism, a mesh
of other ranks, some parameters sharded and others not) is refused at start, naming the parameter.

Usage::

    shards = fsdp_shards(list(model.parameters()), world_size=2, names=names)   # None: not sharded
    shards.ranges[0]                     # key 0's [start, stop) on each rank, e.g. [(0, 16), (16, 28)]
    shards.holder(0, 0, 8)               # 0: rank 0's shard holds all of [0, 8)
    fsdp1_refusal(model)                 # why a model FSDP1 wraps cannot train (None: none does)
    local_flat(param)                    # this rank's shard, flat (a view: writes reach the model)
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..config import ConfigError


def dim0_rows(rows: int, world_size: int, rank: int) -> tuple[int, int]:
    """The rows ``[first, last)`` rank ``rank`` holds of ``rows``, as ``torch.chunk`` and FSDP2 cut dim 0."""
    per_rank = -(-rows // world_size) if rows else 0
    return min(rank * per_rank, rows), min((rank + 1) * per_rank, rows)


@dataclass(frozen=True)
class LocalShards:
    """Each key's flat range on every rank (``ranges[key][rank]``), for a party of ``world_size`` ranks."""

    world_size: int
    ranges: dict[int, list[tuple[int, int]]]

    @classmethod
    def of_shapes(cls, shapes: Mapping[int, Sequence[int]], world_size: int) -> LocalShards:
        """The map of keys with these global shapes, sharded on dim 0 (a 0-d tensor counts as one row)."""
        ranges = {}
        for key, shape in shapes.items():
            rows = shape[0] if shape else 1
            row_numel = math.prod(shape[1:]) if shape else 1
            ranges[key] = [(first * row_numel, last * row_numel)
                           for first, last in (dim0_rows(rows, world_size, r) for r in range(world_size))]
        return cls(world_size, ranges)

    def held(self, key: int, rank: int) -> tuple[int, int]:
        """The flat range of ``key`` that ``rank`` holds."""
        return self.ranges[key][rank]

    def holder(self, key: int, start: int, stop: int) -> int | None:
        """The rank whose shard holds all of ``[start, stop)`` of ``key`` (None: it crosses a shard boundary)."""
        for rank, (low, high) in enumerate(self.ranges[key]):
            if low <= start and stop <= high and low < high:
                return rank
        return None

    def merged(self, other: LocalShards) -> LocalShards:
        """This map and ``other``'s keys together (keys declared by two ``init`` calls)."""
        return LocalShards(self.world_size, {**self.ranges, **other.ranges})


def is_sharded(tensor: Any) -> bool:
    """Whether ``tensor`` is a DTensor (an FSDP2 parameter, say). torch.distributed.tensor is looked up, not
    imported: importing it costs every worker ~0.5 CPU-s (sympy), and no DTensor exists unless something (FSDP2)
    imported it."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(tensor, module.DTensor)


def sharding_refusal(name: str, placements: Sequence[Any], mesh_ranks: Sequence[int], world_size: int) -> str | None:
    """Why a DTensor ``name`` with ``placements`` on a mesh of ``mesh_ranks`` (nested lists for a mesh of more
    than one dimension) is not a sharding geomx syncs in a party of ``world_size`` ranks (None: it is)."""
    from torch.distributed.tensor import Shard  # only for DTensors: already imported (see is_sharded)

    if any(isinstance(row, (list, tuple)) for row in mesh_ranks):
        return (f"parameter {name!r} lives on a {len(mesh_ranks)}-D device mesh (HSDP, or FSDP with tensor "
                "parallelism): a collective party syncs FSDP2 on a 1-D mesh of its ranks only")
    if len(placements) != 1 or type(placements[0]) is not Shard or placements[0].dim != 0:
        return (f"parameter {name!r} is placed {tuple(placements)}: a collective party syncs FSDP2's Shard(0) "
                "only (no shard_placement_fn, no Replicate)")
    if list(mesh_ranks) != list(range(world_size)):
        return (f"parameter {name!r} is sharded over ranks {list(mesh_ranks)}: a collective party syncs shards over "
                f"all its {world_size} ranks (the default process group)")
    return None


def fsdp_shards(tensors: Sequence[torch.Tensor], world_size: int, names: Sequence[str] | None = None,
                party: str = "?", keys: Sequence[int] | None = None) -> LocalShards | None:
    """The ``LocalShards`` of ``tensors`` (as ``keys``; default 0, 1, ... in order) if they are FSDP2 parameters,
    None if none is a DTensor; ConfigError naming the first parameter whose sharding geomx cannot sync, or a mix of
    both kinds."""
    keys = list(keys) if keys is not None else list(range(len(tensors)))
    labels = list(names) if names is not None else [f"key {key}" for key in range(len(tensors))]
    sharded = [is_sharded(t) for t in tensors]
    if not any(sharded):
        return None
    if not all(sharded):
        plain = [label for label, s in zip(labels, sharded, strict=True) if not s][:3]
        raise ConfigError(f"party {party}: parameters {plain} are plain tensors beside FSDP2-sharded ones: call "
                          "fully_shard on the root module too, so that every parameter is sharded")
    shapes = {}
    for key, label, tensor in zip(keys, labels, tensors, strict=True):
        assert is_sharded(tensor)
        refusal = sharding_refusal(label, tensor.placements, tensor.device_mesh.mesh.tolist(), world_size)
        if refusal is not None:
            raise ConfigError(f"party {party}: {refusal}")
        shapes[key] = tuple(tensor.shape)
    shards = LocalShards.of_shapes(shapes, world_size)
    first: Any = tensors[0]
    rank = first.device_mesh.get_local_rank()
    for key, label, tensor in zip(keys, labels, tensors, strict=True):
        low, high = shards.held(key, rank)
        if local_flat(tensor).numel() != high - low:
            raise ConfigError(f"party {party}: rank {rank} holds {local_flat(tensor).numel()} elements of "
                              f"parameter {label!r}, but FSDP2's dim-0 chunks give it {high - low}")
    return shards


def fsdp1_refusal(model: Any) -> str | None:
    """Why ``model`` cannot train if FSDP1 (``FullyShardedDataParallel``) wraps any part of it (None: it does not).
    FSDP1's flat parameters are each rank's shard of several tensors, the same shape on every rank: the wrapper
    would take them for whole tensors and average different shards. Looked up, not imported, as DTensor is."""
    module = sys.modules.get("torch.distributed.fsdp.fully_sharded_data_parallel")
    if module is None:
        return None
    for name, sub in model.named_modules():
        if isinstance(sub, module.FullyShardedDataParallel):
            return (f"module {name or '(the model)'} is wrapped in FSDP1 (FullyShardedDataParallel), whose flat "
                    "parameters geomx cannot sync: use FSDP2's fully_shard (HFA, DiLoCo and ESync in a lan: "
                    "collective party) or DDP")
    return None


def local_flat(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of ``tensor`` (a DTensor), flat: a view, so writes into it reach the model."""
    with torch.no_grad():
        local = tensor.to_local() if is_sharded(tensor) else tensor  # type: ignore[attr-defined]
        return local.detach().view(-1)
