"""Bridging torch tensors and the NumPy arrays the wire and the servers hold: without copies where NumPy has the
tensor's dtype, widened exactly where it has not (bfloat16).

Received data are read-only views of ZeroMQ buffers. torch warns when it wraps a read-only array because
writing to it would be undefined; geomx only ever reads such tensors, so the warning is silenced here, in
one place, rather than the data copied.

A bfloat16 model (the usual dtype of a large language model's weights) travels and is held by the servers as
float32: every bfloat16 value is a float32 value, so what a rank sends is its values exactly; the servers sum and
step in float32 (their copy of the model is float32: master weights); and an answer lands in the bfloat16 model
rounded to nearest even, as torch's ``copy_`` rounds. Where no codec is set, a push of a bfloat16 tensor goes as
bfloat16's bits (exact: ``geomx.worker.slices.push_codec``) and what is float32 by nature (a sum going up, an
answer, a delta) as float32; ``compression: {type: bf16}`` carries those as bfloat16's bits too.

Usage::

    source = readonly_tensor(message.tensor)     # never write to `source`
    out.copy_(source)
    data = host_numpy(piece)                     # piece on the CPU as NumPy: a view, or a float32 copy of bfloat16
"""

from __future__ import annotations

import warnings

import numpy as np
import torch


def readonly_tensor(array: np.ndarray) -> torch.Tensor:
    """A torch view of ``array`` (which may be read-only). The caller must not write to it."""
    if array.flags.writeable:
        return torch.from_numpy(array)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(array)


def wire_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a tensor of ``dtype`` travels in and the servers hold: itself, or float32 for bfloat16 (which NumPy
    lacks; see the module docstring)."""
    return torch.float32 if dtype == torch.bfloat16 else dtype


def host_numpy(tensor: torch.Tensor) -> np.ndarray:
    """``tensor`` on the CPU as NumPy, flat: a view where it is a contiguous CPU tensor of a dtype NumPy has, else a
    copy (a GPU's tensor; a bfloat16 one, widened to float32 exactly)."""
    flat = tensor.detach().reshape(-1)
    if flat.dtype != wire_dtype(flat.dtype):
        return flat.to(device="cpu", dtype=wire_dtype(flat.dtype)).numpy()
    return flat.to("cpu").contiguous().numpy()
