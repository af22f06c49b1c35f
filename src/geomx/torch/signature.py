"""A fixed-size fingerprint of a model's parameters, so workers with different models fail at start.

Every worker builds the fingerprint of its own model; the master worker's travels to everyone through
``kv.init`` (the master's value wins), and each worker compares it with its own. Without this check a
mismatched model fails later, at the first parameter whose shape differs, while the other workers wait
for a round that never completes.

The vector is float64, length ``SIGNATURE_LEN``: the parameter count, the element count, the first
``MAX_LISTED`` parameter sizes, and a SHA-256 of every shape and dtype.

Usage::

    mine = signature(model)
    problem = compare(mine, masters, names)     # None, or a sentence naming the first difference
"""

from __future__ import annotations

import hashlib

import torch
from torch import nn

MAX_LISTED = 64
_DIGEST = 32
SIGNATURE_LEN = 2 + _DIGEST + MAX_LISTED


def described(model: nn.Module) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape, dtype) of every parameter, in ``model.named_parameters()`` order."""
    return [(name, tuple(p.shape), str(p.dtype).removeprefix("torch.")) for name, p in model.named_parameters()]


def signature(model: nn.Module) -> torch.Tensor:
    """The fingerprint vector of ``model`` (names are not part of it: only shapes and dtypes)."""
    params = list(model.parameters())
    digest = hashlib.sha256()
    for p in params:
        digest.update(f"{tuple(p.shape)}:{p.dtype};".encode())
    vector = torch.zeros(SIGNATURE_LEN, dtype=torch.float64)
    vector[0] = len(params)
    vector[1] = sum(p.numel() for p in params)
    vector[2:2 + _DIGEST] = torch.tensor(list(digest.digest()), dtype=torch.float64)
    sizes = [p.numel() for p in params[:MAX_LISTED]]
    vector[2 + _DIGEST:2 + _DIGEST + len(sizes)] = torch.tensor(sizes, dtype=torch.float64)
    return vector


def compare(mine: torch.Tensor, masters: torch.Tensor, model: nn.Module) -> str | None:
    """None when the fingerprints agree; otherwise what differs, as precisely as the vectors allow."""
    if torch.equal(mine, masters):
        return None
    params = described(model)
    count, total = int(masters[0]), int(masters[1])
    head = (f"this worker's model has {len(params)} parameter tensors ({int(mine[1]):,} elements), the master "
            f"worker's has {count} ({total:,} elements)")
    listed = 2 + _DIGEST
    for index in range(min(len(params), count, MAX_LISTED)):
        here, there = int(mine[listed + index]), int(masters[listed + index])
        if here != there:
            name, shape, _ = params[index]
            return (f"{head}; the first difference is parameter {index} ({name!r}, shape {shape}): "
                    f"{here:,} elements here, {there:,} on the master worker")
    if len(params) != count:
        return head
    return f"{head}; the shapes or dtypes differ beyond the sizes compared (same element counts)"
