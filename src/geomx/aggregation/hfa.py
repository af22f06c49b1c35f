"""HFA as an aggregation: a party's average model goes up as a weighted delta every K2-th round, the global
model moves by the deltas' sum, and the answer is the global model, or its change under a residual codec.

The local tier's counting and deltas are ``geomx.policies.hfa.LocalFrequencyAggregation``; this plug-in puts
them into the server's rounds. A global server adds the weighted deltas to the global model (or feeds their
negation to an outer optimizer as a gradient) and answers with the new global model, or, with a residual
codec where every party gets every answer, with the model's change since the last answer, compressed with
the codec's residual so the WAN is sparse both ways (flagged in the body by ``MODEL_CHANGE``).

Usage (the composition root)::

    aggregation = hfa_from_config(node_config, server)
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from ..codecs import CodecError, SizeAdaptive
from ..codecs.messages import payload_fields
from ..config import Mode, NodeConfig, Role
from ..core.plugins import Aggregation, ServerHost, SlotId
from ..core.rounds import Round
from ..policies.hfa import LocalFrequencyAggregation
from ..wire import Message

log = logging.getLogger("geomx.server")

# A global server's answer under HFA with a residual codec carries the change of the global model since the
# last answer (compressed with the codec's own residual), not the model: flagged in the body by this key.
MODEL_CHANGE = "model_change"


class HfaAggregation(Aggregation):
    """HFA's tiers: a local server's model averages and deltas, a global server's model and its changes."""

    push_kind = "delta"
    answers_weights = True
    answers_plain_sums = False  # the global model (or its change), not the sum of the parties' deltas

    def __init__(self, host: ServerHost, local: LocalFrequencyAggregation | None, hips: bool) -> None:
        self.host = host
        self.local = local  # a local server's counting and deltas (None on a global server)
        self.hips = hips  # every party has a local server (a model change is meaningful only then)

    def upward(self, sid: SlotId, total: np.ndarray) -> np.ndarray | None:
        """None on a local round (the party's average model goes straight back); every K2-th, the delta."""
        assert self.local is not None
        return self.local.after_local_round(sid, total)

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
        info = self.host.tensor_info(rnd.key, rnd.part, "delta", "pull")
        if isinstance(codec, SizeAdaptive):
            codec = codec.choose(value, info)
        if (codec is None or not codec.keeps_residual() or not self.hips
                or self.host.table.policy.clients_leave_independently):
            return None
        change = np.subtract(value, previous, dtype=np.float32)
        try:
            fields = payload_fields(codec, change, info)
        except CodecError as exc:
            log.error("[%s] key %d slice %d: cannot compress the model change (%s); the model goes dense",
                      self.host.name, rnd.key, rnd.part, exc)
            return None
        fields["body"] = {**(fields.get("body") or {}), MODEL_CHANGE: True}
        return fields

    def answered(self, sid: SlotId, reply: Message) -> str | None:
        """A model change becomes the model: the last global model plus the change."""
        if reply.tensor is None or not (reply.body or {}).get(MODEL_CHANGE):
            return None
        known = self.local.global_model(sid) if self.local is not None else None
        if known is None:
            return ("the global server sent a model change, but this server holds no global model of key "
                    f"{sid[0]} slice {sid[1]}")
        reply.tensor = np.add(known, reply.tensor, dtype=np.float32).astype(known.dtype, copy=False)
        return None

    def adopted(self, sid: SlotId, value: np.ndarray) -> None:
        """INIT and global rounds both answer with the global model: the next deltas are taken from it."""
        if self.local is not None:
            self.local.set_global_model(sid, value)

    def may_drop(self, usual: bool) -> bool:
        """The global model moves by whichever parties' deltas arrive, so a global server goes on without a
        dead party; a local tier averages its workers' models and keeps its weights: it stops."""
        return self.local is None


def hfa_from_config(config: NodeConfig, host: ServerHost) -> HfaAggregation:
    """A server's HFA: a local server counts K2 and weighs its party by its share of all workers."""
    topology = config.topology
    assert topology.hfa is not None
    local = None if config.role is Role.GLOBAL_SERVER else LocalFrequencyAggregation(
        topology.hfa.k2, config.num_workers / topology.num_all_workers)
    return HfaAggregation(host, local, hips=topology.mode is Mode.HIPS)
