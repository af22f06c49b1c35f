"""The round machine: every global round of a collective party's rank, whatever its form, through one mechanism.

A local round ``count`` counts every slice this rank owns; those going global *leave*: their values are taken
from the party's model (read in place, or copied to the host by the mirror), their weighted deltas made on the
host, sent, and the answers (each slice's new global model) written into the slices' global models, then into
the job's model on every rank of the party. The rounds differ only in when and where:

- blocking (``delay`` 0): the trip runs at once, a window of the owned slices at a time (at most ``depth``
  windows out, each landing before its buffer takes the next), so a rank holds a few windows beyond the model,
  not a second copy of its owned half;
- overlapped (``delay`` tau, Streaming DiLoCo): the leaving slices are copied into a buffer of the trip's own
  while the rank computes its next step (it waits for the copy only before its parameters change again,
  ``copied``), and the rest of the trip runs on a thread of the machine's own; the trip *lands* tau local rounds
  later, when the rank waits for it if it is not in yet;
- the party's model held whole on every rank (``PartyModel.whole``): the owners' new slices go from their job
  models to the other ranks' (``share``) as soon as they are in, on the trip's own group; held as FSDP2 shards:
  the owned slices are gathered from the shards (an all-to-all) as they leave, and at a landing every owned
  slice's global model goes up into the chunk and back into the shards (``spread``), on the rank's own thread;
- the device: only the host mirror (``geomx.collective.mirror``) differs; the deltas, the codec and the sockets
  always read host memory.

The slices' global models (what their deltas start from, and what a residual codec's answers are changes of) are
host tensors: the job model's own ranges where the mirror does not copy (a whole model on the CPU), else a host
buffer of the owned slices, copied up into the job's model (or the chunk) after each landing.

Usage (by ``CollectivePeriodicAverage``)::

    machine = RoundMachine(rules, ranks, party_model, job_model, mirror, delay=1, group=sibling)
    machine.copied()                               # before each optimizer step
    machine.land(count)                            # a local round: what lands now is in the job's model
    machine.leave(views, count, priority)          # the slices going global now leave
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager

import torch

from ...collective.group import PartyGroup
from ...collective.mirror import Copy, HostMirror
from ...collective.owners import OwnedSlice
from ...collective.party_model import PartyModel
from ...core.ranks import PartyRanks, Pieces
from ...protocol.wire import SliceId
from .rules import LocalFrequencyAggregation

WINDOWS = 32  # a blocking round's window is about 1/WINDOWS of the model (a larger slice is a window alone)
DEPTH = 4  # windows out at once: 1/8 of the model per rank, enough to keep a 10 Gbit/s, 50 ms link busy at 85M
# but never less than this many elements (4 MiB of float32): a window of a small model, 1/32 of it, would keep
# too little on the wire (the digits MLP's 35K-element windows of 64K-element slices left 4 slices out per rank,
# each new one waiting for an answer: its 100 Mbit/s round took 30 ms longer); the memory it costs is small
MIN_WINDOW = 1 << 20

class RoundMachine:
    """One rank's global rounds: blocking or overlapped, a whole model or FSDP2 shards, on any device."""

    def __init__(self, rules: LocalFrequencyAggregation, ranks: PartyRanks, model: PartyModel,
                 job_model: Sequence[torch.Tensor], mirror: HostMirror, delay: int = 0,
                 group: PartyGroup | None = None, window: int | None = None, depth: int = DEPTH) -> None:
        if depth < 1:
            raise ValueError(f"windows out at once must be at least 1, got {depth}")
        if delay >= rules.k2:  # a slice would land as it leaves again (streaming_options refuses such a job)
            raise ValueError(f"a global round's delay ({delay}) must be below HFA's K2 ({rules.k2})")
        self.rules, self.ranks, self.model, self.mirror = rules, ranks, model, mirror
        self.delay, self.depth = delay, depth
        self.job_model = list(job_model)
        self.group = group or model.group  # where a whole model's shares run (a sibling's, off the rank's thread)
        self.owned = model.layout.owned[model.group.rank]
        total = sum(owned.numel for rank_slices in model.layout.owned for owned in rank_slices)
        self.window = window if window is not None else max(MIN_WINDOW, -(-total // WINDOWS))
        self.dtype = self.job_model[0].dtype
        # a blocking round's buffer: a window, or one larger slice; never more than this rank owns
        self.size = max([min(self.window, sum(owned.numel for owned in self.owned)),
                         *(owned.numel for owned in self.owned)])
        # each owned slice's place in ``owned``, and (a whole model) its range of the job model, on the device
        self.at = {owned.id: at for at, owned in enumerate(self.owned)}
        self.ranges = self._job_ranges() if model.whole else []
        self.globals = self._global_models()
        for owned, model_of in zip(self.owned, self.globals, strict=True):
            rules.set_global_model(owned.id, model_of.numpy())  # a view: written in place after each round
        self.free: list[torch.Tensor] = []  # blocking windows' buffers, reused
        # an overlapped trip's buffer: room for this rank's owned slices of the largest fragment; the buffers of
        # landed trips are reused, the first made resident now (a fresh one page-faulted on the first round: on the
        # 2-core machine that cost it 0.2-0.35 s)
        per_fragment = [0] * rules.fragments
        for owned in self.owned:
            per_fragment[rules.fragment(owned.id)] += owned.numel
        self.trip_size = max(per_fragment, default=0)
        self.spare: list[torch.Tensor] = [mirror.host(self.trip_size, self.dtype)] if delay else []
        self.in_flight: dict[int, tuple[torch.Tensor, Future[None]]] = {}  # overlapped trips by landing round
        self.copy: Copy | None = None  # the last leaving slices' copy (overlapped)
        self.thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="geomx-fragments") if delay else None
        # held while a trip writes the slices' global models and the job model: a reader sees every slice whole
        self.writing = threading.Lock()
        if delay and model.whole:  # the trips' group and its sockets warm before the first round
            model.share(self.job_model, group=self.group)

    def _global_models(self) -> list[torch.Tensor]:
        """Each owned slice's global model, on the host: the job model's range, or a host buffer's piece filled
        from it (from the shards through the chunk, under FSDP2)."""
        ranges = self.ranges if self.model.whole else self._job_ranges()
        if self.model.whole and not self.mirror.copies:
            return ranges
        host = self.mirror.host(sum(owned.numel for owned in self.owned), self.dtype)
        pieces = list(_cut(host, self.owned))
        self.mirror.down(ranges, pieces).wait()
        return pieces

    def _job_ranges(self) -> list[torch.Tensor]:
        """Where each owned slice's global model lives on the device: its range of the job model (a whole model),
        or its piece of the chunk, gathered from the job model's shards (FSDP2)."""
        if self.model.whole:
            return [self.job_model[owned.key][owned.start:owned.stop] for owned in self.owned]
        self.model.own(self.job_model)
        return [piece for _, piece in self.model.pieces]

    def lands(self, owned: OwnedSlice, count: int) -> bool:
        """Whether local round ``count`` brings ``owned`` its new global model (``delay`` rounds after it left)."""
        sent = count - self.delay
        return sent >= 1 and self.rules.goes_global(owned.id, sent)

    def any_lands(self, count: int) -> bool:
        """Whether any slice of the party lands at ``count`` (the same answer on every rank)."""
        return any(self.lands(owned, count) for rank_slices in self.model.layout.owned for owned in rank_slices)

    def any_leaves(self, count: int) -> bool:
        """Whether any slice of the party goes global at local round ``count`` (the same answer on every rank)."""
        return any(self.rules.goes_global(owned.id, count)
                   for rank_slices in self.model.layout.owned for owned in rank_slices)

    def copied(self) -> None:
        """Wait for the last leaving slices' copy (raising what it raised): before the parameters change again."""
        if self.copy is not None:
            copy, self.copy = self.copy, None
            copy.wait()

    def land(self, count: int) -> bool:
        """Local round ``count``: wait for the overlapped trip landing now, if any (raising what it raised); the
        slices that land are then the job model's. Whether any slice of the party lands."""
        flight = self.in_flight.pop(count, None)
        if flight is not None:
            buffer, trip = flight
            trip.result()
            self.spare.append(buffer)
        if not self.any_lands(count):
            return False
        self.mirror.hand_over()  # the compute stream's next work (the mix) after the trips' copies and shares
        if not self.model.whole:  # every owned slice's global model up into the chunk, then into the shards
            with self.writing:
                self.mirror.up(self.globals, [piece for _, piece in self.model.pieces]).wait()
            self.model.spread(self.job_model)
        return True

    def leave(self, views: Sequence[torch.Tensor], count: int, priority: Sequence[int],
              tokens: Mapping[SliceId, int] | None = None) -> None:
        """Local round ``count``: counted for every owned slice; those going global leave (blocking: out and back
        now), with the samples behind each (``tokens``, decoupled rounds: in their bodies). Every rank of the party
        takes part where any rank's slices leave (they join the same moves)."""
        leaving = [owned for owned in self.owned if self.rules.count_round(owned.id)]
        if not self.any_leaves(count):
            return
        sources = self._sources(views, leaving)
        if not self.delay:
            self._blocking(leaving, sources, count, priority, tokens)
            return
        buffer = self.spare.pop() if self.spare else self.mirror.host(self.trip_size, self.dtype)
        due = list(zip(leaving, _cut(buffer, leaving), strict=True))
        self.copy = copy = self.mirror.down(sources, [piece for _, piece in due])
        trip = self._trips().submit(self._trip, copy, due, count, priority, tokens)
        self.in_flight[count + self.delay] = (buffer, trip)

    def _sources(self, views: Sequence[torch.Tensor], leaving: Sequence[OwnedSlice]) -> list[torch.Tensor]:
        """The leaving slices' values as the rank trains them: the model's ranges, or (FSDP2) their pieces of
        the chunk, gathered from the shards now."""
        if self.model.whole:
            return [views[owned.key][owned.start:owned.stop] for owned in leaving]
        self.model.own(views)
        piece_of = {owned.id: piece for owned, piece in self.model.pieces}
        return [piece_of[owned.id] for owned in leaving]

    def _blocking(self, leaving: Sequence[OwnedSlice], sources: Sequence[torch.Tensor], count: int,
                  priority: Sequence[int], tokens: Mapping[SliceId, int] | None = None) -> None:
        """A blocking trip: ``leaving`` out in windows, each window's answers in before its buffer is reused."""
        out: deque[tuple[torch.Tensor, Pieces, list[object]]] = deque()
        source_of = {owned.id: source for owned, source in zip(leaving, sources, strict=True)}
        for window in self.windows(leaving):
            buffer = self.free.pop() if self.free else self.mirror.host(self.size, self.dtype)
            pieces = list(zip(window, _cut(buffer, window), strict=True))
            window_sources = [source_of[owned.id] for owned in window]
            if self.mirror.copies:
                self.mirror.down(window_sources, [piece for _, piece in pieces]).wait()
                window_sources = [piece for _, piece in pieces]
            for (owned, piece), source in zip(pieces, window_sources, strict=True):
                if source.dtype != piece.dtype:  # a bfloat16 model: widened into the buffer, the delta made there
                    source = piece.copy_(source)
                self.rules.delta(owned.id, source.numpy(), out=piece.numpy())  # in one pass from the model
            out.append((buffer, pieces, self.ranks.send(pieces, priority, kind="delta", tokens=tokens)))
            if len(out) >= self.depth:
                self._land_window(*out.popleft())
        while out:
            self._land_window(*out.popleft())
        self._publish(count)

    def _land_window(self, buffer: torch.Tensor, pieces: Pieces, futures: list[object]) -> None:
        """A window's answers (waited for) into the slices' global models; its buffer free for the next."""
        self._answers(pieces, futures)
        self.free.append(buffer)

    def _answers(self, pieces: Pieces, futures: Sequence[object]) -> None:
        """The answers of ``pieces``' sends into the pieces, then into their slices' global models."""
        bases = [self.globals[self.at[owned.id]] for owned, _ in pieces]  # a residual codec's answers change these
        self.ranks.land(pieces, futures, bases)
        with self.writing:
            for (_, answer), base in zip(pieces, bases, strict=True):
                base.copy_(answer)

    def _publish(self, sent: int) -> None:
        """A whole model's slices that went global at local round ``sent``: up into the job model (where the mirror
        copies), then from their owners to every rank (FSDP2's go into the shards at the landing)."""
        if not self.model.whole:
            return
        went: Callable[[OwnedSlice], bool] = lambda owned: self.rules.goes_global(owned.id, sent)  # noqa: E731
        with self.mirror.side(), self.writing:
            if self.mirror.copies:
                mine = [at for at, owned in enumerate(self.owned) if went(owned)]
                self.mirror.up([self.globals[at] for at in mine], [self.ranges[at] for at in mine]).wait()
            self.model.share(self.job_model, only=went, group=self.group)

    def _trip(self, copy: Copy, due: list[tuple[OwnedSlice, torch.Tensor]], sent: int,
              priority: Sequence[int], tokens: Mapping[SliceId, int] | None = None) -> None:
        """An overlapped trip on the machine's thread, once ``copy`` filled ``due``: the deltas, in place; out and
        back; the answers into the slices' global models; published."""
        copy.wait()
        for owned, piece in due:
            self.rules.delta(owned.id, piece.numpy(), out=piece.numpy())
        self._answers(due, self.ranks.send(due, priority, kind="delta", tokens=tokens))
        self._publish(sent)

    def _trips(self) -> ThreadPoolExecutor:
        assert self.thread is not None, "only an overlapped machine sends trips off its thread"
        return self.thread

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

    @contextmanager
    def reading(self) -> Iterator[list[torch.Tensor]]:
        """The job model, while no trip writes it: every slice as one global round left it, never half of one
        round's values and half of the next's. Usage: ``with machine.reading() as model: out.copy_(model[0])``."""
        with self.writing:
            yield self.job_model

    def finish(self) -> None:
        """Trips still out complete on their thread (their answers are not needed) before the rank leaves, so none
        is cut off mid-message."""
        for _, trip in self.in_flight.values():
            trip.exception()  # waits; a failure here only means the round's answer is not needed
        self.in_flight.clear()
        self.copy = None
        if self.thread is not None:
            self.thread.shutdown(wait=True)
        self.mirror.close()


def _cut(buffer: torch.Tensor, slices: Sequence[OwnedSlice]) -> Iterator[torch.Tensor]:
    """``buffer``'s pieces for ``slices``, back to back."""
    at = 0
    for owned in slices:
        yield buffer[at:at + owned.numel]
        at += owned.numel
