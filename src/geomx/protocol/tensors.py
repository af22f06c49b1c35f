"""Bridging received NumPy buffers and torch tensors without copies.

Received data are read-only views of ZeroMQ buffers. torch warns when it wraps a read-only array because
writing to it would be undefined; geomx only ever reads such tensors, so the warning is silenced here, in
one place, rather than the data copied.

Usage::

    source = readonly_tensor(message.tensor)     # never write to `source`
    out.copy_(source)
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
