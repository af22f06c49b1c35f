"""FSA in a ``lan: collective`` party whose script sharded the model with FSDP2 (``fully_shard``): every step each
rank syncs the gradients of the shards it holds with the global servers; nobody gathers the model. MixedSync,
DCASGD and SSP, whose workers do what FSA's do (only the servers differ), run these too.

Per step, as data: FSDP2's backward reduce-scatters the party's gradients and averages them, so each rank holds
the party's mean gradient of its shards -> the slices it owns (``ShardedPartyModel.own``: owners are the shards'
holders wherever a slice lies inside one shard, so little or nothing crosses ranks), times the party's ranks: the
party's sum, what a local server would push -> (WAN) one push per owned slice to the global server holding it ->
the answers, written back into the shards (``spread``): the gradients' global sum, which every rank divides by the
job's workers before the wrapped optimizer steps on its shards (``ShardedLocalStep``); or, when the global servers
run the optimizer, the new weights themselves (``ShardedServerStep``). The same arithmetic as the unsharded
collective path (``geomx.algorithms.fsa.collective``), from the shards instead of gradient buckets; FSDP2's
reduce-scatter replaces that path's, so nothing overlaps backward here beyond what FSDP2 overlaps itself.

Usage (chosen by the wrapper for an FSDP2 model in a collective party, for its plan's FSA-family mode)::

    strategy = ShardedLocalStep(loop)      # or ShardedServerStep: the optimizer on the global servers
    strategy.step()                        # after backward
"""

from __future__ import annotations

import time

import torch

from ...collective.host import HostChunk
from ...collective.party_model import PartyModel
from ...core.strategy import AveragedStep, WorkerStrategy
from .strategy import refused_average, warn_no_gradient


class ShardedServerStep(WorkerStrategy):
    """The global servers run the optimizer: the answers are the new weights of each rank's shards."""

    # each rank holds its shards of the job's model, not the model: nothing another party's digest could match
    same_model_everywhere = False

    party_model: PartyModel
    stage: HostChunk

    def init_keys(self) -> None:
        loop = self.loop
        self.party_model = loop.ranks.party_model(loop.params)  # FSDP2's shards: a ShardedPartyModel
        self.stage = HostChunk(self.party_model.chunk, self.party_model.pieces)
        self.trained = set(loop.trained)

    def step(self) -> None:
        self.sync(self.gradients(), list(self.loop.params))

    def average_gradients(self) -> None:
        raise RuntimeError(refused_average(self.loop))

    def gradients(self) -> list[torch.Tensor]:
        """Each parameter's gradient (FSDP2's shards of the party's mean). FSA rounds need every key: a trained
        parameter without one gets zeros, said once."""
        loop = self.loop
        grads = []
        for key, param in enumerate(loop.params):
            if param.grad is None and key in self.trained:
                warn_no_gradient(loop, key)
                param.grad = torch.zeros_like(param)
            grads.append(param.grad if param.grad is not None else torch.zeros_like(param))
        return grads

    def sync(self, grads: list[torch.Tensor], into: list[torch.Tensor]) -> None:
        """Push the party's sum of every owned slice of ``grads``; write the answers into ``into``'s shards
        (tensors sharded as the parameters are). Keys nobody trains keep what ``into`` holds."""
        loop = self.loop
        ranks = loop.ranks
        started = time.monotonic()
        self.party_model.own(self.party_model.views(grads))
        self.party_model.chunk.mul_(ranks.group.world_size)  # FSDP2 averaged over the party's ranks: their sum
        self.stage.down()
        ranks.exchange([(owned, piece) for owned, piece in self.stage.pieces if owned.key in self.trained],
                       loop.priority)
        self.stage.up()
        views = self.party_model.views(into)
        # an untrained key's owned slices hold its gradients, not answers: spread them into a copy, thrown away
        targets = [view if key in self.trained else view.clone() for key, view in enumerate(views)]
        self.party_model.spread(targets)
        loop.waited(time.monotonic() - started)


class ShardedLocalStep(AveragedStep, ShardedServerStep):
    """The global servers answer with the sum of every worker's gradients; every rank divides its shards of it by
    the job's workers and steps the wrapped optimizer on them (DDP's arithmetic, across data centers)."""

    keeps_model = True  # the servers hold gradient sums: the model and the optimizer state are the workers'

    def average(self) -> None:
        grads = self.gradients()
        self.sync(grads, grads)
        scale = 1.0 / self.loop.kv.num_all_workers
        for key in self.trained:
            grads[key].mul_(scale)
