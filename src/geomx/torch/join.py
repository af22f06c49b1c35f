"""Uneven loops inside a collective party (``with opt.join():``, DDP's ``Join``): a rank whose data ends first
takes zero-gradient steps beside its party's other ranks until every one's loop has ended, then all leave together.

Every collective of a party needs every rank, so a rank that stops stepping early would hold the others until the
round timeout. Inside ``join``, each ``step()`` first counts, over a process group of its own (so the count never
meets the step's own collectives out of order), the ranks still training. Once a rank's loop ends it *shadows*: it
counts itself out, and while any rank still trains it takes that step with zero gradients (pushed as backward would
push them, then ``step()``), so that its collectives meet theirs and its model and optimizer take the same update
(its owned slices go on syncing with the global servers); when the count is zero every rank leaves. A missing rank's
gradient counts as zero in the party's sum, which is still divided by every rank of the job, as DDP's ``Join``
divides by the initial world size. DDP's and FSDP2's own collectives run inside backward, which a shadow step does
not run: with the script's DDP or an FSDP2 model ``join`` is refused. In a ``lan: server`` party (the same script runs
in every party) it evens out nothing: that party's workers must run the same steps.

Usage::

    with opt.join():                      # every rank of the party enters it, at the same point
        for x, y in loader:               # each rank's own number of batches
            opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from ..collective.fsdp import is_sharded
from ..collective.group import PartyGroup

log = logging.getLogger("geomx.torch")


def join_refusal(ddp: bool, sharded: bool) -> str | None:
    """Why ``join()`` cannot even out this model's loops (the script's DDP, an FSDP2 model), or None where it can.
    It names the cause and says what to do: the refusal used to read as a description of what join() does."""
    if not (ddp or sharded):
        return None
    what = "the script's DistributedDataParallel" if ddp else "an FSDP2-sharded model (fully_shard)"
    return (f"join() is refused with {what}: its collectives run inside backward, which a rank whose loop has "
            "ended does not run, so that rank could not meet them: give every rank the same number of steps (a "
            "sampler that pads, as DistributedSampler does) and leave join() out")


class UnevenLoops:
    """A party's count of the ranks still training, and the shadow steps of a rank whose loop has ended."""

    def __init__(self, wrapper: Any, group: PartyGroup | None) -> None:
        """``wrapper``: the ``DistributedOptimizer`` (its trained parameters, ``push_gradients`` and ``step``);
        ``group``: a group of the party's ranks for the count alone (None: a server party's, which counts nothing)."""
        self.wrapper = wrapper
        self.group = group
        self.counting = False  # inside the block, this rank's loop still running: each step() counts it in

    @classmethod
    def of(cls, wrapper: Any) -> UnevenLoops:
        """The wrapper's, with a group of its own (made here: every rank of the party calls this at one point);
        RuntimeError where a rank whose loop has ended could not take its party's steps."""
        ranks = wrapper.ranks
        if ranks is None:  # a lan: server party (the same script runs in every party): its loops must be even
            log.info("[%s] join(): a lan: server party evens out nothing; its workers run the same steps",
                     wrapper.kv.name)
            return cls(wrapper, None)
        refusal = join_refusal(wrapper.ddp is not None, any(is_sharded(p) for p in wrapper.params))
        if refusal is not None:
            raise RuntimeError(f"{wrapper.kv.name}: {refusal}")
        return cls(wrapper, ranks.group.sibling(wrapper.kv.config.topology.timeouts.round_s))

    @contextmanager
    def block(self) -> Iterator[None]:
        """The loop inside: counted in at every step; once it ends, the shadow steps."""
        self.counting = self.group is not None
        try:
            yield
            self.counting = False
            if self.group is not None:
                self.shadow()
        finally:
            self.counting = False

    def count(self, training: bool) -> int:
        """How many of the party's ranks still train this step (every rank calls it once per step)."""
        assert self.group is not None, "a server party counts nothing"
        flag = torch.full((1,), 1.0 if training else 0.0)
        self.group.all_reduce(flag)
        return int(flag.item())

    def shadow(self) -> None:
        """This rank's loop has ended: zero-gradient steps while any rank of the party still trains."""
        wrapper = self.wrapper
        while self.count(training=False) > 0:
            for key in wrapper.trained:
                param = wrapper.params[key]
                param.grad = torch.zeros_like(param)
            wrapper.push_gradients()
            wrapper.step()  # not counted in: ``counting`` is off once the loop has ended
