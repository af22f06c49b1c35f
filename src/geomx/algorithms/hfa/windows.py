"""Blocking HFA's global round on a whole-model CPU rank, a window of its owned slices at a time: the memory of a
few windows, not of every owned slice at once.

A global round sends the delta of every slice this rank owns (half the model with 2 ranks) and writes each answer
into the job's model (DiLoCo's copy of the global model; the slices' global models are its ranges). Through the
owned chunk that took a buffer of every owned slice for the deltas and, at once, every answer's frame: about the
model's size again beyond the job's model (blocking HFA's rank peaked at 1.9x the model over plain PyTorch, where
streaming's took 1.1-1.2x). Here the deltas are computed, straight from the model, into a window of about
1/``WINDOWS`` of the model; at most ``DEPTH`` windows are out at once (the next computed while those are on the
wire), and each lands into the job's model before its buffer takes the next window. Then every owner's new
slices go from its job model to the other ranks' (``WholePartyModel.share``).

Usage (by ``CollectivePeriodicAverage`` when it applies: CPU tensors, gloo, no overlapped rounds)::

    rounds = WindowedRounds(rules, loop.ranks, bucket, job_model)
    if rounds.run(views, count, priority):   # local round ``count``: the owned slices due, out and back; shared
        ...                                  # some slice of the party went global: its job model range is new
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence

import torch

from ...collective.bucket import WholePartyModel
from ...collective.owners import OwnedSlice
from .rules import LocalFrequencyAggregation
from .trips import Pieces, SliceRounds

WINDOWS = 32  # a window is about 1/WINDOWS of the model (a larger slice is a window alone)
DEPTH = 4  # windows out at once: 1/8 of the model per rank, enough to keep a 10 Gbit/s, 50 ms link busy at 85M
# but never less than this many elements (4 MiB of float32): a window of a small model, 1/32 of it, would keep
# too little on the wire (the digits MLP's 35K-element windows of 64K-element slices left 4 slices out per rank,
# each new one waiting for an answer: its 100 Mbit/s round took 30 ms longer); the memory it costs is small
MIN_WINDOW = 1 << 20


class WindowedRounds:
    """The blocking global rounds of one rank, through ``depth`` buffers of ``window`` elements."""

    def __init__(self, rules: LocalFrequencyAggregation, ranks: SliceRounds, bucket: WholePartyModel,
                 job_model: Sequence[torch.Tensor], window: int | None = None, depth: int = DEPTH) -> None:
        if depth < 1:
            raise ValueError(f"windows out at once must be at least 1, got {depth}")
        self.rules, self.ranks, self.bucket, self.depth = rules, ranks, bucket, depth
        self.job_model = list(job_model)
        self.owned = bucket.layout.owned[bucket.group.rank]
        total = sum(owned.numel for share in bucket.layout.owned for owned in share)
        self.window = window if window is not None else max(MIN_WINDOW, -(-total // WINDOWS))
        # a buffer: a window, or one larger slice; never more than this rank owns
        self.size = max([min(self.window, sum(owned.numel for owned in self.owned)),
                         *(owned.numel for owned in self.owned)])
        for owned in self.owned:  # each owned slice's global model (its deltas start there): the job model's range
            rules.set_global_model(owned.id, self._range(owned).numpy())
        self.free: list[torch.Tensor] = []  # buffers of landed windows, reused; made resident at the first round

    def run(self, views: Sequence[torch.Tensor], count: int, priority: Sequence[int]) -> bool:
        """Local round ``count``: each owned slice counted; those going global out in windows, their answers into
        the job's model; then shared. Whether any slice of the party went global (the same on every rank, so
        every rank joins the share)."""
        leaving = [owned for owned in self.owned if self.rules.count_round(owned.id)]
        out: deque[tuple[torch.Tensor, Pieces, list[object]]] = deque()
        for window in self.windows(leaving):
            buffer = self.free.pop() if self.free else torch.empty(self.size, dtype=self.job_model[0].dtype)
            pieces, at = [], 0
            for owned in window:  # the delta from the model's own range, in one pass
                piece = buffer[at:at + owned.numel]
                model = views[owned.key][owned.start:owned.stop]
                if model.dtype != piece.dtype:  # a bfloat16 model: widened into the buffer, the delta made there
                    model = piece.copy_(model)
                self.rules.delta(owned.id, model.numpy(), out=piece.numpy())
                pieces.append((owned, piece))
                at += owned.numel
            out.append((buffer, pieces, self.ranks.send(pieces, priority, kind="delta")))
            if len(out) >= self.depth:
                self._land(*out.popleft())
        while out:
            self._land(*out.popleft())
        went = [owned for share in self.bucket.layout.owned for owned in share
                if self.rules.goes_global(owned.id, count)]
        if not went:
            return False
        self.bucket.share(self.job_model, only=lambda owned: self.rules.goes_global(owned.id, count))
        return True

    def windows(self, slices: Sequence[OwnedSlice]) -> Iterator[list[OwnedSlice]]:
        """``slices`` in order, cut into runs of at most ``window`` elements (a larger slice alone)."""
        run: list[OwnedSlice] = []
        size = 0
        for owned in slices:
            if run and size + owned.numel > self.window:
                yield run
                run, size = [], 0
            run.append(owned)
            size += owned.numel
        if run:
            yield run

    def _land(self, buffer: torch.Tensor, pieces: Pieces, futures: list[object]) -> None:
        """A window's answers (waited for), into the job model's ranges; its buffer free for the next."""
        bases = [self._range(owned) for owned, _ in pieces]  # a residual codec's answers are changes of these
        self.ranks.land(pieces, futures, bases)
        for (_, answer), base in zip(pieces, bases, strict=True):
            base.copy_(answer)
        self.free.append(buffer)

    def _range(self, owned: OwnedSlice) -> torch.Tensor:
        """The job model's range of ``owned``: its global model."""
        return self.job_model[owned.key][owned.start:owned.stop]
