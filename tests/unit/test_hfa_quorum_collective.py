"""Decoupled rounds in a ``lan: collective`` party: every rank counts the party's tokens behind each slice it sends
(``PartyTokens``) as a local server counts its workers' (``HfaAggregation.collected``), and the round machine puts
them in the pushes' bodies. (The jobs, against today's rounds bit for bit and with a slow party: tests/integration/
test_collective_quorum.py.)"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from geomx.algorithms.hfa.collective import CollectivePeriodicAverage, PartyTokens
from geomx.algorithms.hfa.quorum import Decoupled
from geomx.algorithms.hfa.rules import LocalFrequencyAggregation
from geomx.algorithms.hfa.server import HfaAggregation
from geomx.config import topology_from_dict
from geomx.core.rounds import Round
from geomx.protocol.bodies import TOKENS
from geomx.protocol.wire import Kind, Message

SLICES = [(0, 0), (1, 0)]  # one slice in each of two fragments


class OtherRank:
    """The party's group as one rank sees it: the all-reduce adds what the other rank counted since the last one."""

    def __init__(self) -> None:
        self.counted = 0
        self.calls = 0

    def all_reduce(self, tensor: torch.Tensor) -> None:
        tensor += self.counted
        self.counted = 0
        self.calls += 1


def test_a_rank_sends_the_tokens_a_local_server_of_the_same_workers_would() -> None:
    """Two ranks (or workers), one reporting tokens, the other none on some rounds (1 each, as a local server counts
    a worker's push without them), fragments going global on staggered rounds: each slice's count is the party's
    since its own last global round, the same on the rank as on the local server; the all-reduce runs only at rounds
    where some slice goes global."""
    schedule = LocalFrequencyAggregation(k2=4, party_weight=1.0, fragments=2)
    schedule.assign_fragments({sid: 10 for sid in SLICES})
    server = HfaAggregation(None, LocalFrequencyAggregation(k2=4, party_weight=1.0, fragments=2),  # type: ignore
                            hips=True, decoupled=Decoupled(quorum=1))
    group = OtherRank()
    tokens = PartyTokens(group)  # type: ignore[arg-type]
    leaving_rounds = 0
    for count in range(1, 13):
        mine, other = (None if count % 5 == 0 else 3 * count), (None if count % 2 else 7)
        for sid in SLICES:  # the local server: its workers' pushes of every slice, each local round
            rnd = Round(Kind.PUSHPULL, *sid)
            for worker, reported in enumerate((mine, other)):
                rnd.contributions[f"w{worker}"] = Message(Kind.PUSHPULL, body=None if reported is None
                                                          else {TOKENS: reported})
            server.collected(rnd)
        tokens.count(mine)
        group.counted += 1 if other is None else other
        going = [sid for sid in SLICES if schedule.goes_global(sid, count)]
        if not going:
            continue
        leaving_rounds += 1
        assert tokens.leaving(going) == {sid: server.up_body(sid)[TOKENS] for sid in going}, count  # type: ignore
    assert group.calls == leaving_rounds == 6



def collective_strategy(training: dict[str, Any], steps_done: int) -> CollectivePeriodicAverage:
    """A collective party's strategy of 2 ranks of 4 workers (K1 = 2, K2 = 4), as the wrapper makes it."""
    topology = topology_from_dict({"parties": {"dc0": {"workers": 2, "lan": "collective"}, "dc1": 2},
                                   "hfa": {"k1": 2, "k2": 4}, "training": training})
    kv = SimpleNamespace(hfa=topology.hfa, config=SimpleNamespace(topology=topology), num_workers=2,
                         num_all_workers=4)
    loop = SimpleNamespace(kv=kv, ranks=SimpleNamespace(group=OtherRank()), steps_done=steps_done, tokens=None)
    return CollectivePeriodicAverage(loop)  # type: ignore[arg-type]


@pytest.mark.parametrize(("quorum", "common"), [(None, 8), (2, 8), (1, None)])
def test_decoupled_a_rank_sends_its_delta_unweighted_and_below_every_party_holds_no_common_model(
        quorum: int | None, common: int | None) -> None:
    """Decoupled, the delta goes up unweighted with the party's tokens (the global server weighs it); below every
    party, the parties land different rounds' answers: no step has every party holding the same model."""
    strategy = collective_strategy({} if quorum is None else {"quorum": quorum}, steps_done=8)
    assert strategy.rules.party_weight == (0.5 if quorum is None else 1.0)
    assert (strategy.tokens is None) is (quorum is None)
    assert strategy.common_model_step() == common
