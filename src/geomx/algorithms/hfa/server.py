"""HFA as an aggregation: a party's average model goes up as a weighted delta every K2-th round, the global
model moves by the deltas' sum, and the answer is the global model, or its change under a residual codec.

The local tier's counting and deltas are ``geomx.algorithms.hfa.rules.LocalFrequencyAggregation``; this plug-in puts
them into the server's rounds. A global server adds the weighted deltas to the global model (or feeds their
negation to an outer optimizer as a gradient) and answers with the new global model, or, with a residual
codec where every party gets every answer, with the model's change since the last answer, compressed with
the codec's residual so the WAN is sparse both ways (flagged in the body by ``MODEL_CHANGE``).

Streaming outer sync (Streaming DiLoCo, Douillard et al. 2025), by three plug-in options:

- ``fragments`` F: the model goes global in F groups of slices, one every K2/F rounds (``policies.hfa``);
- ``fragment_delay`` tau: a fragment's global round overlaps the next tau local rounds: the workers get the
  party's average at once and go on; the tau-th round after answers with the new global model mixed with the
  party's average of that round, ``(1 - alpha) * global + alpha * average``, waiting for the WAN only if the
  answer has not arrived by then (torchft's ``fragment_sync_delay``);
- ``fragment_alpha`` alpha: that mix (0: the global model alone, as torchft's default); without an overlap the
  fragment's own round answers with the mix, once the new global model is in (torchft mixes at delay 0 too).

Decoupled rounds (``quorum``, ``grace``, ``stale_rounds``: ``geomx.algorithms.hfa.quorum``): a global server's rounds
close by the quorum rule, and merge the parties' deltas weighted by the tokens each reports; a local server sends
its unweighted delta and its party's tokens since its last global contribution (a push reporting none counts 1),
and so does the owning rank of a ``lan: collective`` party (``geomx.algorithms.hfa.collective``).

Usage (the composition root)::

    aggregation = HfaAggregation.from_config(node_config, server, fragments=4, fragment_delay=1)
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ...codecs import CodecError, SizeAdaptive
from ...codecs.messages import payload_fields
from ...config import Mode, NodeConfig, Role, Topology
from ...core.plugins import (
    Aggregation,
    Answer,
    AwaitAnswer,
    PluginHost,
    SendUp,
    SendUpAndAnswer,
    SendUpAndAwait,
    SliceId,
    Upward,
)
from ...core.rounds import MODEL_CHANGE, Round, RoundRule
from ...protocol.bodies import TOKENS, push_tokens
from ...protocol.wire import Message
from .quorum import DECOUPLED_OPTIONS, Decoupled, QuorumRounds, decoupled_options
from .rules import STREAMING_OPTIONS, LocalFrequencyAggregation, streaming_options

log = logging.getLogger("geomx.server")



@dataclass
class InFlight:
    """A fragment's overlapped global round: the local round that answers with its result, and the result."""

    due: int  # the local round (count) that answers with the mixed model
    arrived: np.ndarray | None = None  # the new global model, once the global server answered
    waiting: np.ndarray | None = None  # the due round's average, while that round waits for the answer


def lands_on_arrival(decoupled: Decoupled, parties: int, delay: int, k2: int) -> bool:
    """Whether a local server's global rounds land when their answers arrive (see ``HfaAggregation.on_arrival``):
    under a quorum of fewer than every party, without a ``fragment_delay`` of its own, where K2 > 1."""
    return decoupled.on and decoupled.quorum < parties and not delay and k2 > 1


class HfaAggregation(Aggregation):
    """HFA's tiers: a local server's model averages and deltas, a global server's model and its changes."""

    push_kind = "delta"
    answers_weights = True
    rounds_every_slice = True
    answers_plain_sums = False  # the global model (or its change), not the sum of the parties' deltas
    options: ClassVar[dict[str, type]] = {**STREAMING_OPTIONS, **DECOUPLED_OPTIONS}

    def __init__(self, host: PluginHost, local: LocalFrequencyAggregation | None, hips: bool, delay: int = 0,
                 alpha: float = 0.0, decoupled: Decoupled | None = None) -> None:
        self.host = host
        self.decoupled = decoupled or Decoupled()  # rounds closed by a quorum, merged by tokens (off: quorum 0)
        # a quorum of fewer than every party, and no overlap of its own: a global round's answer lands at the first
        # local round after it arrives (at the latest the one before the slice's next global round)
        self.on_arrival = False
        self.tokens: dict[SliceId, int] = {}  # a local server's: its party's tokens since its last global push
        self.local = local  # a local server's counting and deltas (None on a global server)
        self.hips = hips  # every party has a local server (a model change is meaningful only then)
        self.delay = delay  # local rounds a fragment's global round overlaps (0: the workers wait for it)
        self.alpha = np.float32(alpha)  # the party's average's share in the mix that ends an overlap
        self.in_flight: dict[SliceId, InFlight] = {}

    @classmethod
    def from_config(cls, config: NodeConfig, host: PluginHost, **options: Any) -> HfaAggregation:
        """A server's HFA: a local server counts K2 and weighs its party by its share of all workers."""
        cls.check_options(options, config.topology)
        topology = config.topology
        assert topology.hfa is not None
        decoupled = decoupled_options(options, len(topology.parties))
        # decoupled: the delta goes up unweighted; the global server weighs it by the party's tokens
        weight = 1.0 if decoupled.on else config.num_workers / topology.num_all_workers
        local = None if config.role is Role.GLOBAL_SERVER else LocalFrequencyAggregation(
            topology.hfa.k2, weight, options.get("fragments", 1))
        aggregation = cls(host, local, hips=topology.mode is Mode.HIPS, delay=options.get("fragment_delay", 0),
                          alpha=options.get("fragment_alpha", 0.0), decoupled=decoupled)
        aggregation.on_arrival = lands_on_arrival(decoupled, len(topology.parties), aggregation.delay, topology.hfa.k2)
        return aggregation

    @classmethod
    def check_options(cls, options: Mapping[str, Any], topology: Topology | None = None) -> None:
        """The streaming options' ranges; with the job's K2 known, fragments <= K2 and delay < K2
        (``rules.streaming_options``, which a collective party's ranks run alike)."""
        streaming_options(options, topology.hfa.k2 if topology is not None and topology.hfa is not None else None)
        decoupled = decoupled_options(options, len(topology.parties) if topology is not None else None)
        if decoupled.on and topology is not None and topology.tsengine is not None:
            raise ValueError("quorum: decoupled rounds do not run with tsengine yet (its relays merge the workers' "
                             "pushes, and their tokens with them)")

    def round_rule(self) -> RoundRule | None:
        """Decoupled: a global server's rounds close by the quorum rule."""
        return QuorumRounds(self.decoupled) if self.decoupled.on and self.local is None else None

    def collected(self, rnd: Round) -> None:
        """Decoupled: a local round's tokens (its workers' reports; 1 each that reports none) join the party's."""
        if self.decoupled.on:
            sid = (rnd.key, rnd.slice)
            reported = (push_tokens(m.body) for m in rnd.contributions.values())
            self.tokens[sid] = self.tokens.get(sid, 0) + sum(1 if t is None else t for t in reported)

    def up_body(self, sid: SliceId) -> dict[str, Any] | None:
        """Decoupled: the party's tokens since its last global push of ``sid``."""
        return {TOKENS: self.tokens.pop(sid, 0)} if self.decoupled.on else None

    def merge(self, rnd: Round) -> np.ndarray | None:
        """Decoupled: the deltas (on time, then folded in late) weighted by their tokens' share, summed in that
        order: ``sum_p delta_p * float32(t_p / sum t)`` (each party's share as a local server weighs it today)."""
        if not self.decoupled.on:
            return None
        parts = [*rnd.contributions.values(), *rnd.folded]
        tokens = [push_tokens(m.body) or 0 for m in parts]
        count = sum(tokens)
        total: np.ndarray | None = None
        for message, share in zip(parts, tokens, strict=True):
            if message.tensor is None:
                continue
            term = np.multiply(message.tensor, np.float32(share / count if count else 1 / len(parts)),
                               dtype=np.float32)
            total = term if total is None else np.add(total, term)
        assert total is not None, f"{rnd.describe()} closed without a tensor"
        return total

    def upward(self, sid: SliceId, total: np.ndarray) -> Upward:
        """A local round answers with the party's average; every K2-th of a slice's rounds (its fragment's)
        sends the delta up and answers with the global model (mixed with the round's average where alpha > 0,
        as torchft's ``fragment_update_alpha`` at delay 0), or, overlapped, with the average now and the mix
        ``delay`` rounds later."""
        local = self.local
        assert local is not None
        if local.needs_fragments:  # the first round: every slice is initialized (workers init before they push)
            local.assign_fragments({sid: held.value.size for sid, held in self.host.stored.items()})
        delta = local.after_local_round(sid, total)
        flight = self.in_flight.get(sid)
        if flight is not None and (local.rounds(sid) == flight.due or (self.on_arrival and flight.arrived is not None)):
            if flight.arrived is None:
                flight.waiting = total
                return AwaitAnswer()
            del self.in_flight[sid]
            return Answer(self._mix(flight.arrived, total))
        if delta is None:
            return Answer(total)
        if self.on_arrival:  # the workers go on; the answer lands when it is in
            self.in_flight[sid] = InFlight(due=local.rounds(sid) + local.k2 - 1)
            return SendUpAndAnswer(delta, total)
        if not self.delay and self.alpha:  # the global model mixed with this round's average, once it is in
            self.in_flight[sid] = InFlight(due=local.rounds(sid), waiting=total)
            return SendUpAndAwait(delta)
        if not self.delay:
            return SendUp(delta)
        self.in_flight[sid] = InFlight(due=local.rounds(sid) + self.delay)
        return SendUpAndAnswer(delta, total)

    def resumed(self, sid: SliceId) -> np.ndarray:
        """The overlap's due round (or, without an overlap, the mixing round itself) waited for the new global
        model: the mix."""
        flight = self.in_flight.pop(sid)
        assert flight.arrived is not None and flight.waiting is not None
        return self._mix(flight.arrived, flight.waiting)

    def _mix(self, global_model: np.ndarray, average: np.ndarray) -> np.ndarray:
        if not self.alpha:
            return global_model
        mixed = np.multiply(global_model, np.float32(1) - self.alpha, dtype=np.float32)
        mixed += np.multiply(average, self.alpha, dtype=np.float32)
        return mixed

    def gradient(self, total: np.ndarray) -> np.ndarray:
        """The pushes are weighted model deltas: an outer optimizer takes their negation as its gradient."""
        return np.negative(total)

    def combine(self, value: np.ndarray, total: np.ndarray) -> np.ndarray:
        """The global model moves by the deltas' sum."""
        return np.add(value, total)

    def answer_fields(self, rnd: Round, value: np.ndarray, previous: np.ndarray) -> dict[str, Any] | None:
        """With a residual codec (bsc, mpq's large tensors, error feedback): the global model's change since
        the last answer, compressed with the codec's residual.

        Every party applies the same changes to the same initial model, so all hold ``value - residual``; what
        is held back arrives in later answers. Only where every party gets every answer (rounds that wait for
        every party, HiPS); None (answer as usual) otherwise, or when the tensor's codec keeps no residual.
        """
        codec = self.host.wan_codec
        info = self.host.tensor_info(rnd.key, rnd.slice, "delta", "pull")
        if isinstance(codec, SizeAdaptive):
            codec = codec.choose(value, info)
        if (codec is None or not codec.keeps_residual() or not self.hips or self.decoupled.on
                or self.host.table.policy.clients_leave_independently):
            return None
        change = np.subtract(value, previous, dtype=np.float32)
        try:
            fields = payload_fields(codec, change, info)
        except CodecError as exc:
            log.error("[%s] key %d slice %d: cannot compress the model change (%s); the model goes dense",
                      self.host.name, rnd.key, rnd.slice, exc)
            return None
        fields["body"] = {**(fields.get("body") or {}), MODEL_CHANGE: True}
        return fields

    def answered(self, sid: SliceId, reply: Message) -> str | None:
        """A model change becomes the model: the last global model plus the change."""
        if reply.tensor is None or not (reply.body or {}).get(MODEL_CHANGE):
            return None
        known = self.local.global_model(sid) if self.local is not None else None
        if known is None:
            return ("the global server sent a model change, but this server holds no global model of key "
                    f"{sid[0]} slice {sid[1]}")
        reply.tensor = np.add(known, reply.tensor, dtype=np.float32).astype(known.dtype, copy=False)
        return None

    def adopted(self, sid: SliceId, value: np.ndarray) -> None:
        """INIT and global rounds both answer with the global model: the next deltas are taken from it (an
        overlapped round's answer also ends its overlap, at its due round)."""
        if self.local is not None:
            self.local.set_global_model(sid, value)
        flight = self.in_flight.get(sid)
        if flight is not None and flight.arrived is None:
            flight.arrived = value

    def held(self, sid: SliceId, value: np.ndarray) -> np.ndarray:
        """The job's model is the global one (the stored value is the party's average after a local round); under
        streaming, each fragment's from its last global round that has arrived."""
        known = self.local.global_model(sid) if self.local is not None else None
        return value if known is None else known

    def settled(self, sid: SliceId) -> bool:
        """An overlapped fragment's answer has arrived, or none is on its way."""
        flight = self.in_flight.get(sid)
        return flight is None or flight.arrived is not None

    def may_drop(self, usual: bool) -> bool:
        """The global model moves by whichever parties' deltas arrive, so a global server goes on without a
        dead party; a local tier averages its workers' models and keeps its weights: it stops."""
        return self.local is None
