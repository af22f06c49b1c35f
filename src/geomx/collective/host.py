"""A rank's owned chunk on the host: the only part of a CUDA model that crosses to host memory, in one pinned
buffer, by one asynchronous copy each way.

A collective rank sends over the WAN only the slices it owns (``PartyModel.chunk``). When the model lives on a
GPU, copying each slice to the host on its own would be one synchronizing, pageable copy per slice; instead the
whole chunk goes down once into a pinned buffer (``down``: an asynchronous copy, then a wait for it alone), the
WAN codecs and sockets read and write the host views of the slices (``pieces``), and the chunk goes back up in
one asynchronous copy (``up``) that the stream orders before the next collective. On the CPU the host chunk *is*
the chunk: no copy, no second buffer.

Usage::

    stage = HostChunk(bucket.chunk, bucket.pieces)
    stage.down()                                   # after the reduce-scatter (or ``own``) filled the chunk
    ranks.exchange(stage.pieces, priority)         # numpy views: encoded, sent, answers written in place
    stage.up()                                     # the answers into the chunk, before the all-gather
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .owners import OwnedSlice


class HostChunk:
    """A host mirror of one rank's owned chunk, with a view per owned slice at the same offsets."""

    def __init__(self, chunk: torch.Tensor, pieces: Sequence[tuple[OwnedSlice, torch.Tensor]],
                 copy: bool | None = None) -> None:
        """``copy``: keep a separate host buffer (default: only when ``chunk`` is not on the CPU; a test forces
        it on the CPU to walk the GPU's path)."""
        self.chunk = chunk
        self.copies = chunk.device.type != "cpu" if copy is None else copy
        if not self.copies:
            self.host = chunk
        else:
            pinned = chunk.device.type == "cuda"  # page-locked memory: the copies run asynchronously, at full speed
            self.host = torch.empty(chunk.shape, dtype=chunk.dtype, pin_memory=pinned)
        base = chunk.storage_offset()
        self.pieces: list[tuple[OwnedSlice, torch.Tensor]] = []
        for owned, piece in pieces:
            offset = piece.storage_offset() - base
            if piece.untyped_storage().data_ptr() != chunk.untyped_storage().data_ptr() or not (
                    offset >= 0 and offset + piece.numel() <= chunk.numel()):
                raise ValueError(f"key {owned.key} slice {owned.index}: its piece is not a view into the chunk")
            self.pieces.append((owned, self.host[offset:offset + piece.numel()]))

    def down(self) -> None:
        """``host`` = the chunk as the device's stream has it now (waits for this copy, not for the device)."""
        if not self.copies:
            return
        self.host.copy_(self.chunk, non_blocking=True)
        if self.chunk.device.type == "cuda":
            done = torch.cuda.Event()
            done.record()
            done.synchronize()

    def up(self) -> None:
        """The chunk = ``host`` (asynchronous: the stream orders it before whatever runs on the chunk next)."""
        if self.copies:
            self.chunk.copy_(self.host, non_blocking=True)
