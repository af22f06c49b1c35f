"""A model's tensors packed owner by owner, so that the party's collectives move every slice to its owner in one
call: a reduce-scatter gives each rank the party's sum of the slices it owns, an all-gather gives every rank the
answers its peers brought back.

The buffer holds ``world_size`` chunks of equal length (the most a rank owns; the others padded): chunk
``r`` holds rank ``r``'s owned slices (``geomx.collective.owners``), back to back in declaration order. Packing
copies each slice once (as DDP copies gradients into its buckets); a rank's slices are views into its chunk, so
what it sends over the WAN and what it receives never need another copy.

Usage::

    layout = OwnerLayout(owners, numels={key: p.numel() for key, p in enumerate(params)})
    buffer = layout.empty(dtype=torch.float32, device="cpu")
    layout.pack([p.grad for p in params], buffer)
    dist.reduce_scatter_tensor(layout.chunk(buffer, rank), buffer)   # the party's sums of rank's slices
    for owned, piece in layout.pieces(buffer, rank): ...             # push piece, receive its answer into it
    dist.all_gather_into_tensor(buffer, layout.chunk(buffer, rank).clone())
    layout.unpack(buffer, [p.data for p in params])
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import torch

from .owners import OwnedSlice, SliceOwners


class OwnerLayout:
    """Where each owned slice of the keys ``numels`` names (key -> elements; the tensors passed to ``pack`` and
    ``unpack`` come in that order) sits in a flat buffer of ``world_size`` equal chunks. The owners' other keys
    (the wrapper's own bookkeeping) stay out."""

    def __init__(self, owners: SliceOwners, numels: Mapping[int, int]) -> None:
        self.world_size = owners.world_size
        self.keys = list(numels)
        self.position = {key: i for i, key in enumerate(self.keys)}
        self.numels = [numels[key] for key in self.keys]
        self.owned = [[s for s in owners.owned(rank) if s.key in self.position] for rank in range(self.world_size)]
        declared = {s.key for rank_slices in self.owned for s in rank_slices}
        if declared != set(self.keys):
            raise ValueError(f"the owners declare no slices of keys {sorted(set(self.keys) - declared)[:10]}")
        for rank_slices in self.owned:
            for s in rank_slices:
                if s.stop > numels[s.key]:
                    raise ValueError(f"key {s.key} slice {s.index} ends at {s.stop}, past its "
                                     f"{numels[s.key]} elements")
        self.owned_numel = [sum(s.numel for s in rank_slices) for rank_slices in self.owned]  # per rank
        self.chunk_numel = max(self.owned_numel, default=0)
        # (rank, offset in the rank's chunk) of every owned slice
        self.offsets: list[list[int]] = []
        for rank_slices in self.owned:
            offset, offsets = 0, []
            for s in rank_slices:
                offsets.append(offset)
                offset += s.numel
            self.offsets.append(offsets)
        # where each key's slices sit in the buffer: (start, stop) in the key's tensor, offset in the buffer
        self.places: dict[int, list[tuple[int, int, int]]] = {key: [] for key in self.keys}
        for rank, (rank_slices, offsets) in enumerate(zip(self.owned, self.offsets, strict=True)):
            for s, offset in zip(rank_slices, offsets, strict=True):
                self.places[s.key].append((s.start, s.stop, rank * self.chunk_numel + offset))

    @property
    def numel(self) -> int:
        """Elements of the whole buffer (chunks included padding)."""
        return self.chunk_numel * self.world_size

    def empty(self, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
        """A zeroed buffer for this layout (the padding stays zero)."""
        return torch.zeros(self.numel, dtype=dtype, device=device)

    def chunk(self, buffer: torch.Tensor, rank: int) -> torch.Tensor:
        """Rank ``rank``'s chunk of ``buffer`` (a view)."""
        return buffer[rank * self.chunk_numel:(rank + 1) * self.chunk_numel]

    def pieces(self, buffer: torch.Tensor, rank: int) -> Iterator[tuple[OwnedSlice, torch.Tensor]]:
        """Each slice ``rank`` owns with its view into ``buffer`` (the whole buffer, or just the rank's chunk)."""
        base = rank * self.chunk_numel if buffer.numel() == self.numel else 0
        for s, offset in zip(self.owned[rank], self.offsets[rank], strict=True):
            yield s, buffer[base + offset:base + offset + s.numel]

    def _walk(self, tensors: Sequence[torch.Tensor], buffer: torch.Tensor
              ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if len(tensors) != len(self.numels):
            raise ValueError(f"expected {len(self.numels)} tensors, got {len(tensors)}")
        if buffer.numel() != self.numel:
            raise ValueError(f"buffer has {buffer.numel()} elements; the layout needs {self.numel}")
        flats = []
        for key, numel, tensor in zip(self.keys, self.numels, tensors, strict=True):
            if tensor.numel() != numel:
                raise ValueError(f"key {key} has {tensor.numel()} elements; the layout says {numel}")
            flats.append(tensor.view(-1))
        for rank in range(self.world_size):
            for s, piece in self.pieces(buffer, rank):
                yield flats[self.position[s.key]][s.start:s.stop], piece

    def pack_key(self, key: int, tensor: torch.Tensor, buffer: torch.Tensor) -> None:
        """Copy one key's tensor into its places in ``buffer`` (as its gradient arrives, say)."""
        flat = tensor.detach().reshape(-1)
        with torch.no_grad():
            for start, stop, at in self.places[key]:
                buffer[at:at + stop - start].copy_(flat[start:stop])

    def pack(self, tensors: Sequence[torch.Tensor], buffer: torch.Tensor) -> None:
        """Copy ``tensors`` (one per key, in the layout's order, contiguous) into ``buffer``, owner by owner."""
        with torch.no_grad():
            for source, piece in self._walk(tensors, buffer):
                piece.copy_(source)

    def unpack(self, buffer: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
        """Copy ``buffer`` back into ``tensors`` (one per key, in the layout's order, contiguous)."""
        with torch.no_grad():
            for target, piece in self._walk(tensors, buffer):
                target.copy_(piece)
