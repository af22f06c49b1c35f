"""One early-answer client (``geomx.core.early.EarlyAnswers``), two settle policies: a local server answers at once
(``Settle.AT_ONCE``), a collective party's rank adds the others' sum into its piece when the round's bare answer
arrives (``Settle.ON_REPLY``). Both key the sums by (global server, key, slice) and round, and give the same bits;
the rank's ``land`` and its kvstore tier (``geomx.worker.tier``) go through the client."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from geomx.codecs import default_registry
from geomx.collective.owners import OwnedSlice
from geomx.core.early import EarlyAnswers, Settle
from geomx.core.rounds import ALONE, EARLY
from geomx.core.sharding import ShardPlanner
from geomx.protocol.wire import Kind, Message
from geomx.worker.ranks import PartyRanks
from geomx.worker.sender import SliceSender
from geomx.worker.slices import KeyTable
from geomx.worker.tier import CollectiveTier, LanTier

RNG = np.random.default_rng(0)
OTHERS = RNG.standard_normal(16).astype(np.float32)
PUSHED = RNG.standard_normal(16).astype(np.float32)


def early(number: int, tensor: np.ndarray = OTHERS, sender: bytes = b"gs0", key: int = 0) -> Message:
    message = Message(Kind.PUSHPULL, key=key, slice=0, num_slices=1, tensor=tensor, body={EARLY: number})
    message.sender = sender
    return message


def bare(number: int, alone: bool = False, key: int = 0) -> Message:
    body = {EARLY: number, ALONE: True} if alone else {EARLY: number}
    return Message(Kind.PUSHPULL, key=key, slice=0).reply(body=body)


def test_both_policies_settle_an_early_sum_to_the_same_bits() -> None:
    at_once, got = EarlyAnswers(Settle.AT_ONCE), []
    at_once.store("gs0", early(5))
    at_once.forwarded("gs0", 0, 0, PUSHED, got.append)  # answered at once: both sums are here
    assert len(got) == 1 and at_once.settled("gs0", bare(5))

    on_reply = EarlyAnswers(Settle.ON_REPLY)
    on_reply.store("gs0", early(5))
    assert EarlyAnswers.bare(bare(5)) and not EarlyAnswers.bare(early(5).reply(tensor=OTHERS))
    others = on_reply.others("gs0", bare(5))
    assert others is not None and np.array_equal(np.add(others, PUSHED), got[0])


def test_on_reply_keeps_each_rounds_sum_apart_and_gives_it_once() -> None:
    client = EarlyAnswers(Settle.ON_REPLY)
    client.store("gs0", early(5, OTHERS))
    client.store("gs0", early(6, PUSHED))  # the next round's, before this round's answer was landed
    assert np.array_equal(client.others("gs0", bare(5)), OTHERS)  # type: ignore[arg-type]
    assert np.array_equal(client.others("gs0", bare(6)), PUSHED)  # type: ignore[arg-type]
    with pytest.raises(LookupError, match="closed round 5 of key 0 slice 0 early, but its early sum never came"):
        client.others("gs0", bare(5))


def test_on_reply_keys_by_the_global_server_and_a_round_alone_adds_nothing() -> None:
    client = EarlyAnswers(Settle.ON_REPLY)
    client.store("gs1", early(2))
    with pytest.raises(LookupError):
        client.others("gs0", bare(2))  # another global server's sum of the same key and slice
    assert client.others("gs0", bare(2, alone=True)) is None
    assert client.others("gs1", bare(2)) is not None


class Answered:
    """Requests whose futures are done already: ``wait`` returns their answers."""

    def __init__(self) -> None:
        self.names = {"gs0": "global server 0"}

    def wait(self, future: Future[Message], timeout: float, what: str) -> Message:
        return future.result(timeout=0)


def _rank() -> tuple[PartyRanks, list[tuple[OwnedSlice, torch.Tensor]]]:
    keys = KeyTable(ShardPlanner(1, slice_elems=64), ["gs0"])
    keys.add(0, torch.zeros(16))
    sender = SliceSender(Answered(), keys, None, default_registry(), timeout_s=1.0)  # type: ignore[arg-type]
    ranks = PartyRanks(SimpleNamespace(world_size=1, rank=0), True, sender)  # type: ignore[arg-type]
    return ranks, [(OwnedSlice(0, 0, 1, 0, 16), torch.from_numpy(PUSHED.copy()))]


def _done(reply: Message) -> Future[Message]:
    future: Future[Message] = Future()
    future.set_result(reply)
    return future


def test_a_rank_lands_an_early_round_as_the_others_sum_plus_its_piece() -> None:
    ranks, pieces = _rank()
    tier = CollectiveTier(ranks)
    assert tier.handles(early(4)) and not tier.handles(early(4).reply(tensor=OTHERS))  # answers are the kvstore's
    ranks.land(pieces, [_done(bare(4))])
    assert torch.equal(pieces[0][1], torch.from_numpy(np.add(OTHERS, PUSHED)))
    ranks.land(pieces, [_done(bare(5, alone=True))])  # nobody else pushed: the piece is the answer
    assert torch.equal(pieces[0][1], torch.from_numpy(np.add(OTHERS, PUSHED)))
    with pytest.raises(RuntimeError, match="global server 0 closed round 6 of key 0 slice 0 early, but its early sum"):
        ranks.land(pieces, [_done(bare(6))])
    assert not LanTier().handles(early(4))  # a party with a local server: its local server takes early sums
