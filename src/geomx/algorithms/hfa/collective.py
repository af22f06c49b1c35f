"""HFA / DiLoCo in a ``lan: collective`` party: inner steps data-parallel inside the party (gradients all-reduced
every step, as DDP), and every ``K1 * K2`` steps a global round in which each rank sends the weighted delta of the
slices it owns and brings back their new global model, then one all-gather.

With a model sharded by FSDP2 the same strategy runs over the shards (``loop.ranks.party_model`` gives it a
``ShardedPartyModel`` instead of a ``WholePartyModel``): FSDP2 already averaged the gradients, each rank's job model is
its shards, and a global round moves the owned slices from the shards to their owners and the answers back (an
all-to-all each way) instead of an all-gather: nobody holds the whole model. Under the script's own DDP the inner
steps are DDP's (its all-reduce, its buckets and hooks): the strategy only steps and runs the global rounds.

The party's ranks hold one model (DDP keeps them equal), so the local average of HiPS HFA has nothing to average:
a collective party counts K1 steps per local round without a LAN round, and every K2-th local round goes global
(with ``fragments``, each fragment on its own round, as ``LocalFrequencyAggregation`` decides). What a rank sends
for a slice is what a local server would send, ``(model - global model) * n_p / N``, and the global servers (their
outer optimizer included) do not know the difference.

Every global round goes through one mechanism, ``machine.RoundMachine``: blocking or overlapped (``fragment_delay``
tau, Streaming DiLoCo: a fragment's deltas leave from a buffer of their own and every rank trains on; tau local
rounds later the answers land), a whole model or FSDP2 shards, on the CPU or a GPU (only the host mirror differs:
``geomx.collective.mirror``; ``training.staged: true`` runs the GPU's shape of it on the CPU). When slices
land, each rank mixes the job's model into its own, ``(1 - fragment_alpha) * global + fragment_alpha * own``, as a
local server answers its workers (without an overlap too, as torchft's ``fragment_update_alpha`` at delay 0).

Decoupled rounds (``training.quorum``, ``geomx.algorithms.hfa.quorum``): a rank sends its slices' deltas unweighted,
each with the party's tokens since the slice's last global round (``PartyTokens``: every rank's ``step(tokens=)``,
1 per local round where a rank reports none, as a local server counts a worker's push; summed over the party by a
one-number all-reduce at each local round where some slice goes global). A late push is answered at once with the
global model, which lands as any answer does (blocking: at once; overlapped: at its due round).

Usage (chosen by the wrapper for a collective party under HFA)::

    strategy = CollectivePeriodicAverage(loop)
    strategy.step()                              # after backward: all-reduce, a local step, a sync when due
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

import torch

from ...collective.mirror import mirror_for
from ...collective.overlap import OverlappedMean
from ...collective.party_model import PartyModel
from ...core.ranks import RankGroup
from ...core.strategy import AveragedStep, Loop
from ...protocol.tensors import wire_dtype
from ...protocol.wire import SliceId
from .machine import RoundMachine
from .quorum import decoupled_options
from .rules import LocalFrequencyAggregation, streaming_options
from .strategy import global_round_steps


class CollectivePeriodicAverage(AveragedStep):
    """Inner steps on the party's mean gradient; the owned slices' global rounds when due."""

    def __init__(self, loop: Loop) -> None:
        super().__init__(loop)
        hfa = loop.kv.hfa
        # read and checked as a local server's plug-in reads them (a bad one refused here with the same words)
        topology = loop.kv.config.topology
        options = dict(topology.training.plugin_options)
        streaming = streaming_options(options, hfa.k2)
        decoupled = decoupled_options(options, len(topology.parties))
        self.k1 = hfa.k1
        # decoupled: the delta goes up unweighted, with the party's tokens; the global server weighs it by them
        weight = 1.0 if decoupled.on else loop.kv.num_workers / loop.kv.num_all_workers
        self.rules = LocalFrequencyAggregation(k2=hfa.k2, party_weight=weight, fragments=streaming.fragments)
        self.tokens = PartyTokens(loop.ranks.group) if decoupled.on and loop.ranks is not None else None
        # a quorum below every party: the parties land different rounds' answers, none holds the job's model
        self.own_models = 0 < decoupled.quorum < len(topology.parties)
        self.party_model: PartyModel | None = None
        self.mean: OverlappedMean | None = None  # whole-model ranks: gradients all-reduced as backward makes them
        self.machine: RoundMachine | None = None
        self.local_steps = 0
        self.local_rounds = 0
        self.streaming = streaming
        self.delay = streaming.delay  # local rounds a fragment's global round overlaps
        self.alpha = streaming.alpha  # the party's model's share in the mix (at delay 0 too, as torchft's)

    def init_keys(self) -> None:
        loop = self.loop
        kv = loop.kv
        self.party_model = party_model = loop.ranks.party_model(loop.params)
        # under FSDP2 the shards' gradients come averaged already, and so do they under the script's own DDP
        if party_model.whole and loop.ddp is None:
            self.mean = OverlappedMean(loop.ranks.group, loop.params, loop.ranks.layout,  # DDP's buckets of bucket_mb
                                       kv.config.topology.training.bucket_bytes, trained=loop.trained)
            self.pushes_gradients = True  # read by the wrapper after init_keys: backward's hooks call on_gradient
        views = party_model.views(loop.params)
        # the job's model: the global model of the last global round, as this rank holds the model (all of it, or
        # its FSDP2 shards), in the dtype the servers hold (float32 for a bfloat16 model: DiLoCo's outer model)
        job_model = [view.to(wire_dtype(view.dtype), copy=True) for view in views]
        if self.rules.needs_fragments:  # every rank and party splits all the slices alike
            self.rules.assign_fragments(loop.ranks.slice_sizes())
        training = kv.config.topology.training
        mirror = mirror_for(loop.params[0].device, staged=training.staged)
        # overlapped whole models share the landed slices off the rank's thread: over a group of the trips' own
        whole_overlap = self.delay and party_model.whole
        group = loop.ranks.group.sibling(kv.config.topology.timeouts.round_s) if whole_overlap else None
        self.machine = RoundMachine(self.rules, loop.ranks, party_model, job_model, mirror, self.delay, group)

    def steps_of(self, rounds: int) -> int | None:
        return global_round_steps(self.loop, self.k1, rounds)

    def common_model_step(self) -> int | None:
        """At the start of the step after a global round every party holds the global model, where no fragment,
        overlap or mix keeps a part of the party's own and every rank holds the whole model (FSDP2's shards are
        not the model: no digest of them could match another party's)."""
        if (self.streaming.keeps_own_part or self.own_models
                or (self.party_model is not None and not self.party_model.whole)):
            return None
        steps = self.loop.steps_done  # (a job starts, or resumes, at a global round)
        return steps if steps % (self.k1 * self.rules.k2) == 0 else None

    def on_gradient(self, key: int, grad: torch.Tensor) -> None:
        assert self.mean is not None, "only whole-model ranks hook the gradients"
        self.mean.on_gradient(key, grad)

    def inner_step(self) -> None:
        """The party's mean gradient (unless ``average_gradients`` made it this step), then the optimizer."""
        self.take_average()
        self.loop.update()

    def average(self) -> None:
        """The party's mean gradient in every ``.grad``: DDP's all-reduce of the buckets backward filled, FSDP2's
        own under a sharded model; the script's own DDP made it already."""
        assert self.party_model is not None, "init_keys runs first"
        if self.mean is not None:
            self.mean.finish()
        elif self.loop.ddp is None:
            self.party_model.average_gradients(self.loop.params)

    def step(self) -> None:
        assert self.machine is not None, "init_keys runs first"
        self.machine.copied()  # the leaving slices' copy, made while the step computed
        self.inner_step()
        self.local_steps += 1
        if self.local_steps % self.k1 == 0:
            self.sync()

    def sync(self) -> None:
        """A local round: the round landing now is waited for and mixed into the party's model; the owned slices
        due leave (blocking: out and back first, then mixed). Whether any slice lands is the same answer on every
        rank (the rules know every rank's slices), so every rank joins the same moves."""
        machine, party_model = self.machine, self.party_model
        assert machine is not None and party_model is not None
        views = party_model.views(self.loop.params)
        self.local_rounds += 1
        count = self.local_rounds
        tokens = self._tokens(count)
        started = time.monotonic()
        if not self.delay:
            machine.leave(views, count, self.loop.priority, tokens)
        landed = machine.land(count)
        self.loop.waited(time.monotonic() - started)
        if landed:
            self.mix(views, count)
        if self.delay:  # after the mix (no slice lands and leaves at once: delay < K2), so they do not share cores
            machine.leave(views, count, self.loop.priority, tokens)

    def _tokens(self, count: int) -> dict[SliceId, int] | None:
        """Decoupled rounds: this local round's tokens counted; where some slice of the party goes global at
        ``count`` (the same answer on every rank), the party's tokens behind each owned slice that does."""
        counted, self.loop.tokens = self.loop.tokens, None
        if self.tokens is None:
            return None
        self.tokens.count(counted)
        machine = self.machine
        assert machine is not None
        if not machine.any_leaves(count):
            return None
        return self.tokens.leaving(owned.id for owned in machine.owned if self.rules.goes_global(owned.id, count))

    def mix(self, views: list[torch.Tensor], count: int) -> None:
        """The party's model takes every slice that landed at local round ``count``: the new global model, mixed
        with the party's own (``alpha``). Device work (a kernel on a GPU; memory-bound passes on the CPU, which the
        scale bench's stand-in times as its device's)."""
        party_model, machine = self.party_model, self.machine
        assert party_model is not None and machine is not None
        mine = self.alpha  # with or without an overlap, as a local server mixes (torchft's fragment_update_alpha)
        for rank_slices in party_model.layout.owned:  # the party's model: every slice that landed, mixed under overlap
            for owned in rank_slices:
                if machine.lands(owned, count):
                    low, high = party_model.held(owned.key)
                    start, stop = max(low, owned.start) - low, min(high, owned.stop) - low
                    if start >= stop:
                        continue
                    model, new = views[owned.key][start:stop], machine.job_model[owned.key][start:stop]
                    if mine and model.dtype != new.dtype:  # a bfloat16 model: mixed in float32, then rounded
                        model.copy_(torch.lerp(model.to(new.dtype), new, 1.0 - mine))
                    elif mine:
                        model.lerp_(new, 1.0 - mine)  # mine * model + (1 - mine) * new, in one pass
                    else:
                        model.copy_(new)

    def finish(self) -> None:
        """Rounds still overlapping when the loop ends complete on their thread (not into the model) before the
        worker leaves, so none is cut off mid-message."""
        if self.machine is not None:
            self.machine.finish()

    def load_job_model(self, into: Sequence[torch.Tensor]) -> None:
        """The global model of the last global round, as every rank of the party holds it (no traffic)."""
        assert self.party_model is not None and self.machine is not None, "init_keys runs first"
        with self.machine.reading() as job_model:  # a trip may be writing it on its thread: read between writes
            for out, model in zip(self.party_model.views(into), job_model, strict=True):
                out.copy_(model)


class PartyTokens:
    """Decoupled rounds in a collective party: the party's tokens since each slice's last global round, the same on
    every rank. Each local round adds this rank's count; at a local round where some slice goes global every rank
    adds its count since the last such round to the party's total (an all-reduce of one number), and each slice
    leaving gets the total's growth since it last left.

    Usage::

        tokens = PartyTokens(loop.ranks.group)
        tokens.count(loop.tokens)                     # every local round (None: 1, as a local server counts it)
        counts = tokens.leaving([(0, 0), (1, 0)])    # every rank at once, where some slice goes global
    """

    def __init__(self, group: RankGroup) -> None:
        self.group = group
        self.counted = 0  # this rank's since the party last summed them
        self.total = 0  # the party's, summed at every local round where some slice went global
        self.marks: dict[SliceId, int] = {}  # a slice -> the party's total when it last went global

    def count(self, tokens: int | None) -> None:
        """A local round of this rank, on ``tokens`` samples (None: the script counts none, 1)."""
        self.counted += 1 if tokens is None else tokens

    def leaving(self, slices: Iterable[SliceId]) -> dict[SliceId, int]:
        """Some slice of the party goes global now (every rank calls this at the same local round): the party's
        tokens behind each of ``slices`` (this rank's leaving ones) since it last went global."""
        counted = torch.tensor([self.counted], dtype=torch.int64)
        self.group.all_reduce(counted)
        self.total += int(counted[0])
        self.counted = 0
        counts = {}
        for sid in slices:
            counts[sid] = self.total - self.marks.get(sid, 0)
            self.marks[sid] = self.total
        return counts
