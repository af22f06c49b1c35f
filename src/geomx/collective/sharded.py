"""The ``PartyModel`` of a party whose script sharded the model with FSDP2: each rank holds its local shards and
the slices it owns, never the whole model.

``own`` brings every owned slice from the shards that hold its elements to its owner (one all-to-all, or none
where every slice lies inside its owner's shard); ``spread`` takes the owners' values back into the shards. The
buffers are the size of the elements that cross ranks, allocated once. Gradients need nothing: FSDP2
reduce-scattered and averaged them in backward.

Usage (inside a collective strategy; ``loop.ranks.party_model`` picks this form for DTensor parameters)::

    bucket = ShardedPartyModel(shards, layout, group, like=local_flat(params[0]))
    views = bucket.views(params)          # this rank's shard of each parameter, flat
    bucket.own(views)                     # bucket.chunk: this rank's owned slices of the party's model
    for owned, piece in bucket.pieces: ...
    bucket.spread(views)                  # the shards: the owners' values
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from .fsdp import LocalShards, is_sharded, local_flat
from .group import PartyGroup
from .layout import OwnerLayout
from .owners import OwnedSlice
from .reshard import Reshard


class ShardedPartyModel:
    """This rank's owned slices and the all-to-all buffers between them and its FSDP2 shards."""

    whole = False

    def __init__(self, shards: LocalShards, layout: OwnerLayout, group: PartyGroup, like: torch.Tensor) -> None:
        self.local_shards = shards
        self.layout = layout
        self.group = group
        self.plan = Reshard(shards, layout, group.rank)
        self.chunk = torch.zeros(layout.chunk_numel, dtype=like.dtype, device=like.device)
        self.pieces: list[tuple[OwnedSlice, torch.Tensor]] = list(layout.pieces(self.chunk, group.rank))
        self._sending = torch.zeros(sum(self.plan.out_splits), dtype=like.dtype, device=like.device)
        self._receiving = torch.zeros(sum(self.plan.in_splits), dtype=like.dtype, device=like.device)

    def views(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """This rank's shard of each of ``tensors`` (DTensors sharded as the model is), flat."""
        views = []
        for key, tensor in enumerate(tensors):
            if not is_sharded(tensor):
                raise ValueError(f"party {self.group.party}: the model is sharded by FSDP2, but tensor {key} is a "
                                 "plain one: pass tensors sharded alike (the parameters of a copy of the model)")
            view = local_flat(tensor)
            low, high = self.held(key)
            if view.numel() != high - low:
                raise ValueError(f"party {self.group.party}: rank {self.group.rank} holds {view.numel()} elements "
                                 f"of tensor {key}; its shard of the model has {high - low}")
            views.append(view)
        return views

    def held(self, key: int) -> tuple[int, int]:
        """This rank's shard of ``key``."""
        return self.local_shards.held(key, self.group.rank)

    def average_gradients(self, params: Sequence[torch.Tensor]) -> None:
        """Nothing: FSDP2's backward reduce-scattered the gradients and averaged them over the party."""

    def own(self, views: Sequence[torch.Tensor], only: Callable[[OwnedSlice], bool] | None = None) -> None:
        """``chunk`` = this rank's owned slices, from the shards that hold them (all of them, whatever ``only``
        accepts: one all-to-all moves them either way)."""
        plan = self.plan
        plan.pack_for_owners(views, self._sending)
        if plan.crosses:
            self.group.all_to_all(self._receiving, self._sending, plan.in_splits, plan.out_splits)
        plan.land_at_owners(self._receiving, views, self.chunk)

    def spread(self, views: Sequence[torch.Tensor], only: Callable[[OwnedSlice], bool] | None = None) -> None:
        """Every rank's shards ``views`` = the owners' values of their elements (all of them, whatever ``only``
        accepts: one all-to-all moves every owner's slices either way)."""
        plan = self.plan
        plan.pack_for_shards(self.chunk, self._receiving)
        if plan.crosses:
            self.group.all_to_all(self._sending, self._receiving, plan.out_splits, plan.in_splits)
        plan.land_in_shards(self._sending, self.chunk, views)

    def share(self, views: Sequence[torch.Tensor], only: Callable[[OwnedSlice], bool] | None = None,
              group: PartyGroup | None = None) -> None:
        """The shards ``views`` as their owners hold them: ``own`` then ``spread`` (on the rank's own group)."""
        self.own(views, only)
        self.spread(views, only)
