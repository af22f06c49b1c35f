"""A worker's keys: how each key's tensor is cut into slices, which server holds each slice, and how a slice
travels as message fields (through the LAN codec, if the worker runs one) and comes back into the caller's tensor.

Usage::

    keys = KeyTable(ShardPlanner(num_global_servers=2, slice_elems=1 << 16), servers)
    info = keys.add(3, tensor)                      # after init: keys.check(3, grad, "push")
    server = keys.server_for(3, index=0)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..codecs import BF16, Codec, Registry, TensorInfo
from ..codecs.base import TensorKind
from ..codecs.messages import decode_message, payload_fields
from ..core.sharding import ShardPlanner
from ..protocol.tensors import host_numpy, readonly_tensor, wire_dtype
from ..protocol.wire import Message


@dataclass
class KeyInfo:
    """One key's shape and slices."""

    shape: torch.Size
    dtype: torch.dtype
    slices: list[tuple[int, int]]
    shards: list[int]  # the global server (shard id) of each slice; see geomx.core.sharding


class KeyTable(dict[int, KeyInfo]):
    """The keys a worker has ``init``-ed, each with its slices; checks what the caller passes against them."""

    def __init__(self, planner: ShardPlanner, servers: list[str]) -> None:
        super().__init__()
        self._planner = planner
        self._servers = servers
        self.closed = False

    def add(self, key: int, value: torch.Tensor) -> KeyInfo:
        """Declare ``key`` with ``value``'s shape; its slices are placed on the global servers."""
        if not isinstance(key, int) or isinstance(key, bool) or key < 0:
            raise TypeError(f"keys are non-negative ints, got {key!r}")
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"init of key {key}: expected a torch.Tensor, got {type(value).__name__}")
        if key in self:
            raise ValueError(f"key {key} is already initialized")
        placed = self._planner.place(value.numel(), value.element_size())
        info = KeyInfo(value.shape, value.dtype, [(p.start, p.stop) for p in placed], [p.shard for p in placed])
        self[key] = info
        return info

    def info(self, key: int) -> KeyInfo:
        """``key``'s slices; a precise error for a closed store, a non-int key or one never declared."""
        if self.closed:
            raise RuntimeError("this KVStore is closed")
        if not isinstance(key, int) or isinstance(key, bool):
            raise TypeError(f"keys are ints, got {type(key).__name__}")
        info = self.get(key)
        if info is None:
            raise KeyError(f"key {key} was never init()ed; known keys: {sorted(self)[:20]}")
        return info

    def check(self, key: int, tensor: torch.Tensor, what: str) -> KeyInfo:
        """``key``'s slices, after checking that ``tensor`` has its shape."""
        info = self.info(key)
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{what} of key {key}: expected a torch.Tensor, got {type(tensor).__name__}")
        if tensor.shape != info.shape:
            raise ValueError(f"{what} of key {key}: shape {tuple(tensor.shape)} differs from init's "
                             f"{tuple(info.shape)}")
        return info

    def server_for(self, key: int, index: int) -> str:
        """Under HiPS the party's local server; in flat mode the global server that owns the slice."""
        if len(self._servers) == 1:
            return self._servers[0]
        return self._servers[self[key].shards[index]]


def to_numpy(tensor: torch.Tensor, snapshot: bool) -> np.ndarray:
    """``tensor`` flat on the CPU as numpy (a copy if ``snapshot``: the caller may change it right away; always a
    float32 copy of a bfloat16 tensor, ``geomx.protocol.tensors``)."""
    if snapshot and tensor.dtype == wire_dtype(tensor.dtype):
        return tensor.detach().to("cpu").reshape(-1).clone().numpy()
    return host_numpy(tensor)


def push_codec(configured: Codec | None, tensor: torch.Tensor, route_encodes: bool = True) -> Codec | None:
    """The codec a push of ``tensor`` travels in: the configured one; else, for a bfloat16 tensor on a route that
    carries codecs' payloads (``route_encodes``: ``PushRoute.carries_codecs``), bfloat16's bits (``BF16``: exact,
    its values being bfloat16's, and half the float32 they are widened to); else none."""
    if configured is None and route_encodes and tensor.dtype == torch.bfloat16:
        return BF16()
    return configured


def payload(codec: Codec | None, key: int, index: int, piece: np.ndarray, tensor_numel: int,
            kind: TensorKind = "gradient") -> dict[str, Any]:
    """Message fields carrying ``piece`` (a slice of a tensor of ``tensor_numel`` elements; ``kind``: what it
    holds, for the codec): encoded by ``codec`` (float32/64 data only), else as is."""
    if codec is None or piece.dtype not in (np.float32, np.float64):
        return {"tensor": piece}
    return payload_fields(codec, piece, TensorInfo(key, index, kind, "push", tensor_numel))


def copy_out(codecs: Registry, replies: list[Message], info: KeyInfo, out: torch.Tensor) -> None:
    """Write the slices' answers into ``out`` (decoding any that a flat PS's global server compressed)."""
    flat = out.view(-1) if out.is_contiguous() else None
    target = flat if flat is not None else torch.empty(out.numel(), dtype=out.dtype)
    for (start, stop), reply in zip(info.slices, replies, strict=True):
        data = decode_message(codecs, reply)
        if data is None:
            raise RuntimeError("server answered without data")
        target[start:stop].copy_(readonly_tensor(data))
    if flat is None:
        out.copy_(target.view(out.shape))
