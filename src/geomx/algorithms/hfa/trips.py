"""Streaming HFA's overlapped global rounds on a whole-model CPU rank: each fragment's round trip on a thread of
the rank's own, from a buffer the size of one fragment, into the job's model.

At the local round a fragment leaves, once the rank has mixed the fragment that landed (before, where one fragment
lands and leaves at once), a thread of the trips' copies the slices of it that the rank owns into a buffer (one pass
over about 1 / (fragments x ranks) of the model) while the rank computes its next step: the rank waits for the copy
only before its parameters change again (``copied``, before the optimizer's step). On the trip's thread: their
deltas, in place; sent, encoded by the job's codec; the answers decoded into the same buffer and written into the
job's model (the slices' global models are its ranges); then every owner's new slices go from its job model to the
other ranks' (``WholePartyModel.share``, over a group of the trips' own). When the fragment lands, the rank only mixes
it into its model. A rank holds, beyond plain training, the job's model (DiLoCo's copy of the global model) and one
buffer per fragment in flight: with ``fragments`` 4 and 2 ranks, one eighth of the model each, where a chunk of
every owned slice (half the model) and a spread's scratch stood before.

Usage (by ``CollectivePeriodicAverage`` when it applies: CPU tensors, gloo, fragments > 1, an overlap)::

    trips = FragmentTrips(rules, loop.ranks, bucket, job_model, delay=1, group=loop.ranks.group.sibling(timeout_s))
    trips.land(count)                        # at a local round: waits for the fragment that lands now, if any
    trips.leave(views, count, priority)      # its leaving slices' copy and round trip started
    trips.copied()                           # before the next optimizer step: the copy is done
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Protocol

import torch

from ...collective.bucket import WholePartyModel
from ...collective.group import PartyGroup
from ...collective.owners import OwnedSlice
from .rules import LocalFrequencyAggregation

Pieces = Sequence[tuple[OwnedSlice, torch.Tensor]]


class SliceRounds(Protocol):
    """What the trips ask of the rank's kvstore (``geomx.worker.ranks.PartyRanks``): its owned slices out, and
    their answers back into the same pieces."""

    def send(self, pieces: Pieces, priority: Sequence[int], kind: Any = "gradient") -> list[Any]: ...

    def land(self, pieces: Pieces, futures: Sequence[Any], bases: Sequence[torch.Tensor] | None = None) -> None: ...


class FragmentTrips:
    """The overlapped global rounds of one rank, ``delay`` local rounds each, one at a time in the order they left."""

    def __init__(self, rules: LocalFrequencyAggregation, ranks: SliceRounds, bucket: WholePartyModel,
                 job_model: Sequence[torch.Tensor], delay: int, group: PartyGroup) -> None:
        self.rules, self.ranks, self.bucket, self.delay, self.group = rules, ranks, bucket, delay, group
        self.job_model = list(job_model)
        self.owned = bucket.layout.owned[group.rank]
        per_fragment = [0] * rules.fragments
        for owned in self.owned:
            per_fragment[rules.fragment(owned.id)] += owned.numel
        self.size = max(per_fragment, default=0)  # the most elements this rank sends in one fragment's round
        for owned in self.owned:  # each owned slice's global model (its deltas start there): the job model's range
            rules.set_global_model(owned.id, self.job_model[owned.key][owned.start:owned.stop].numpy())
        # buffers of fragments landed, for the next to leave; the first made resident now (touched), so the first
        # round does not page-fault a fresh buffer in (on the 2-core machine that cost the first round 0.2-0.35 s)
        self.free: list[torch.Tensor] = [self._buffer().zero_()]
        self.in_flight: dict[int, tuple[torch.Tensor, Future[None]]] = {}  # landing round -> buffer, round trip
        self.thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="geomx-fragments")
        # the leaving slices' copies, on a thread of their own: a round trip still out (delay > 1) does not hold one
        self.copier = ThreadPoolExecutor(max_workers=1, thread_name_prefix="geomx-fragment-copies")
        self.copy: Future[None] | None = None  # the last leaving fragment's copy
        # held while a trip writes the job model (its answers, then the share): a reader sees every slice whole
        self.writing = threading.Lock()
        bucket.share(self.job_model, group=group)  # the trips' group and its sockets warm before the first round

    def leave(self, views: Sequence[torch.Tensor], count: int, priority: Sequence[int]) -> None:
        """Local round ``count``: count it for every owned slice, copy those going global into a buffer, and start
        their round trip. Every rank starts one when any rank of the party sends (they all join the share)."""
        leaving = [owned for owned in self.owned if self.rules.count_round(owned.id)]
        anywhere = any(self.rules.goes_global(owned.id, count) for share in self.bucket.layout.owned
                       for owned in share)
        if not anywhere:
            return
        buffer = self.free.pop() if self.free else self._buffer()
        due, at = [], 0
        for owned in leaving:
            due.append((owned, buffer[at:at + owned.numel]))
            at += owned.numel
        sources = [views[owned.key][owned.start:owned.stop] for owned in leaving]
        self.copy = copy = self.copier.submit(_copy, sources, [piece for _, piece in due])
        self.in_flight[count + self.delay] = (buffer, self.thread.submit(self._trip, copy, due, count, priority))
        if self.lands_and_leaves(count):
            self.copied()  # a slice landing now leaves again (delay a multiple of K2): copied before the mix

    def lands_and_leaves(self, count: int) -> bool:
        """Whether a slice this rank owns lands at local round ``count`` and leaves at it again (``delay`` a multiple
        of K2): its copy must then be made before the mix."""
        # a slice goes global once every K2 rounds, so it lands as it leaves only where delay is a multiple of K2
        # (which a job's topology refuses): no loop over the slices at every local round
        return (count > self.delay and self.delay % self.rules.k2 == 0
                and any(self.rules.goes_global(owned.id, count) for owned in self.owned))

    def copied(self) -> None:
        """Wait for the last leaving fragment's copy (raising what it raised): call before the parameters change
        again, as the optimizer's step changes them."""
        if self.copy is not None:
            copy, self.copy = self.copy, None
            copy.result()

    def _buffer(self) -> torch.Tensor:
        """A fragment's buffer: room for this rank's owned slices of the largest fragment."""
        return torch.empty(self.size, dtype=self.job_model[0].dtype)

    def land(self, count: int) -> None:
        """Wait for the round trip landing at local round ``count`` (raising what it raised), if one does."""
        flight = self.in_flight.pop(count, None)
        if flight is None:
            return
        buffer, trip = flight
        trip.result()
        self.free.append(buffer)

    def _trip(self, copy: Future[None], due: list[tuple[OwnedSlice, torch.Tensor]], sent: int,
              priority: Sequence[int]) -> None:
        """On the trips' thread, once ``copy`` filled ``due``: the deltas, in place; out and back; the answers into
        the job's model; shared."""
        copy.result()
        bases = [self.job_model[owned.key][owned.start:owned.stop] for owned, _ in due]
        for owned, piece in due:
            self.rules.delta(owned.id, piece.numpy(), out=piece.numpy())
        self.ranks.land(due, self.ranks.send(due, priority, kind="delta"), bases)
        with self.writing:
            for (_, answer), base in zip(due, bases, strict=True):
                base.copy_(answer)
            self.bucket.share(self.job_model, only=lambda owned: self.rules.goes_global(owned.id, sent),
                              group=self.group)

    @contextmanager
    def reading(self) -> Iterator[list[torch.Tensor]]:
        """The job model, while no trip writes it: every slice as one global round left it, never half of one
        round's values and half of the next's (a fragment whose answers arrived counts from then, before it lands,
        as a server party's job model does). Usage: ``with trips.reading() as model: out.copy_(model[0])``."""
        with self.writing:
            yield self.job_model

    def finish(self) -> None:
        """Round trips still out complete on their thread (their answers are not needed) before the rank leaves,
        so none is cut off mid-message."""
        for _, trip in self.in_flight.values():
            trip.exception()  # waits; a failure here only means the round's answer is not needed
        self.in_flight.clear()
        self.copy = None
        self.thread.shutdown(wait=True)
        self.copier.shutdown(wait=True)


def _copy(sources: Sequence[torch.Tensor], pieces: Sequence[torch.Tensor]) -> None:
    """Each source range into its piece of a fragment's buffer."""
    for source, piece in zip(sources, pieces, strict=True):
        piece.copy_(source)
