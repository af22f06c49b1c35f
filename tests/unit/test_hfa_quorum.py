"""Decoupled outer rounds: the quorum rule over the round table and HFA's token-weighted merge, driven in one process
by a fake clock and a fake global server, against a simulation in numpy (no sockets, no sleeps)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from geomx.algorithms.fsa.server import FullySynchronous
from geomx.algorithms.hfa.quorum import GRACE_AUTO_MAX_S, Decoupled, QuorumRounds, decoupled_options
from geomx.algorithms.hfa.rules import LocalFrequencyAggregation
from geomx.algorithms.hfa.server import HfaAggregation, lands_on_arrival
from geomx.config import ConfigError, topology_from_dict
from geomx.core.clients import Clients
from geomx.core.inits import Inits
from geomx.core.plugins import Answer, AwaitAnswer, SendUpAndAnswer
from geomx.core.rounds import Round, RoundTable, SliceValue
from geomx.protocol.bodies import TOKENS
from geomx.protocol.wire import Kind, Message
from geomx.server.compose import check_plugins

PARTIES = ["dc0", "dc1", "dc2"]


class GlobalServer:
    """A global server's rounds under HFA without an optimizer: the global model moves by the merge; every answer
    (a round's, or a late or dropped push's at once) is recorded with the model it carried."""

    name = "global_server0"

    def __init__(self, options: Decoupled, model: list[float]) -> None:
        self.now = 0.0
        self.model = np.array(model, dtype=np.float32)
        self.aggregation = HfaAggregation(self, None, hips=True, decoupled=options)  # type: ignore[arg-type]
        rule = self.aggregation.round_rule()
        assert isinstance(rule, QuorumRounds)
        self.rule = rule
        self.table = RoundTable(self, Clients(PARTIES), FullySynchronous(), clock=lambda: self.now, rule=rule)
        self.answers: list[tuple[str, np.ndarray]] = []
        self.names: dict[str, str] = {}  # client -> its name, where not the same (a restarted party's)
        self.stored: dict[tuple[int, int], SliceValue] = {}  # (what a late joiner's INIT reads)
        self.optimizer = None

    def refuse(self, message: Message, text: str) -> None:
        raise AssertionError(text)

    def send(self, peer: str, message: Message) -> None:
        assert message.tensor is not None
        self.answers.append((peer, message.tensor.copy()))

    def complete(self, rnd: Round) -> None:
        merged = self.aggregation.merge(rnd)
        assert merged is not None
        self.model = self.model + merged
        self.table.release(rnd, self.model)

    def answer_early(self, rnd: Round, message: Message) -> None:
        self.answers.append((message.sender.decode(), self.model.copy()))

    def redeliver(self, message: Message) -> None:
        self.table.contribute(message)

    def display(self, client: str) -> str:
        return self.names.get(client, client)

    def all_done(self) -> None:
        raise AssertionError("no shutdown here")

    def push(self, party: str, delta: list[float], tokens: int | None, at: float) -> None:
        """``party`` sends its unweighted delta at time ``at`` (the clock moves there first)."""
        self.tick(at)
        body = {TOKENS: tokens} if tokens is not None else None
        message = Message(Kind.PUSHPULL, tensor=np.array(delta, dtype=np.float32), body=body)
        message.sender = party.encode()
        self.table.contribute(message)

    def tick(self, at: float) -> None:
        self.now = at
        self.table.complete_ready()

    def answered(self, party: str) -> list[np.ndarray]:
        return [value for peer, value in self.answers if peer == party]


def weighted(parts: list[tuple[list[float], int]]) -> np.ndarray:
    """The simulation's merge: every delta times its tokens' share, in float64."""
    total = sum(tokens for _, tokens in parts)
    merged = sum(np.array(delta, dtype=np.float64) * tokens / total for delta, tokens in parts)
    return np.asarray(merged)


def test_a_round_every_party_makes_closes_at_once_without_grace() -> None:
    server = GlobalServer(Decoupled(quorum=2, grace=10.0), [0.0])
    for at, party in enumerate(PARTIES):
        server.push(party, [1.0], tokens=1, at=float(at))
    assert server.table.completed(Kind.PUSHPULL, 0, 0) == 1
    assert [party for party, _ in server.answers] == PARTIES
    assert server.rule.report()["closed_by_grace"] == 0


def test_a_round_closes_when_the_quorum_is_in_and_the_grace_has_passed() -> None:
    server = GlobalServer(Decoupled(quorum=2, grace=1.0), [0.0])
    server.push("dc0", [2.0], tokens=1, at=0.0)
    server.tick(5.0)  # one party is no quorum, however long it waits
    assert server.table.completed(Kind.PUSHPULL, 0, 0) == 0
    server.push("dc1", [4.0], tokens=3, at=5.5)
    server.tick(6.4)
    assert server.table.completed(Kind.PUSHPULL, 0, 0) == 0, "the grace runs from the quorum's arrival"
    server.tick(6.5)
    assert server.table.completed(Kind.PUSHPULL, 0, 0) == 1
    np.testing.assert_allclose(server.model, weighted([([2.0], 1), ([4.0], 3)]), rtol=1e-6)
    report = server.rule.report()
    assert report["closed_by_grace"] == 1 and report["missed"] == {"dc2": 1}
    assert report["last_rounds"][-1] == {"key": 0, "slice": 0, "round": 0, "quorum": ["dc0", "dc1"],
                                         "missing": ["dc2"], "lost": [], "folded": []}


def test_a_late_push_is_answered_at_once_and_folded_into_the_next_round() -> None:
    """dc2 misses round 0; its push comes during round 1: answered with round 0's model, merged into round 1."""
    server = GlobalServer(Decoupled(quorum=2, grace=0.5, stale_rounds=1), [1.0, 1.0])
    server.push("dc0", [0.5, 0.0], tokens=2, at=0.0)
    server.push("dc1", [0.0, 0.5], tokens=2, at=0.1)
    server.tick(0.7)
    after_0 = np.array([1.0, 1.0]) + weighted([([0.5, 0.0], 2), ([0.0, 0.5], 2)])
    np.testing.assert_allclose(server.model, after_0, rtol=1e-6)
    server.push("dc2", [1.0, 1.0], tokens=4, at=0.75)  # late for round 0
    np.testing.assert_allclose(server.answered("dc2")[-1], after_0, rtol=1e-6)  # at once, with round 0's model
    assert server.table.completed(Kind.PUSHPULL, 0, 0) == 1, "a late push counts for no quorum"
    server.push("dc0", [0.2, 0.2], tokens=2, at=1.0)
    server.push("dc1", [0.4, 0.0], tokens=2, at=1.1)
    server.tick(1.7)
    after_1 = after_0 + weighted([([0.2, 0.2], 2), ([0.4, 0.0], 2), ([1.0, 1.0], 4)])
    np.testing.assert_allclose(server.model, after_1, rtol=1e-6)
    assert len(server.answered("dc2")) == 1, "the folded push was answered once, at once"
    report = server.rule.report()
    assert report["late_folded"] == {"dc2": 1} and report["dropped"] == {}
    assert report["last_rounds"][-1]["folded"] == ["dc2"]
    server.push("dc2", [0.0, 0.0], tokens=1, at=1.8)  # from round 0's model, while round 1's is out: late again
    assert server.rule.report()["late_folded"] == {"dc2": 2}
    np.testing.assert_allclose(server.answered("dc2")[-1], after_1, rtol=1e-6)


def test_a_push_beyond_the_staleness_bound_is_answered_and_dropped() -> None:
    server = GlobalServer(Decoupled(quorum=2, grace=0.0, stale_rounds=1), [0.0])
    for number in range(2):  # dc2 misses two rounds
        server.push("dc0", [1.0], tokens=1, at=float(number))
        server.push("dc1", [1.0], tokens=1, at=number + 0.1)
    assert server.table.completed(Kind.PUSHPULL, 0, 0) == 2
    model = server.model.copy()
    server.push("dc2", [100.0], tokens=1, at=3.0)
    np.testing.assert_array_equal(server.answered("dc2")[-1], model)
    server.push("dc0", [1.0], tokens=1, at=4.0)
    server.push("dc1", [1.0], tokens=1, at=4.1)
    np.testing.assert_allclose(server.model, model + 1.0, rtol=1e-6)  # nothing of dc2's
    assert server.rule.report()["dropped"] == {"dc2": 1}


def test_late_pushes_in_a_round_nobody_joins_are_applied_once_every_party_has_left() -> None:
    """dc2's push, a round late, is folded into round 1; dc0 and dc1 have finished and never push again. The round
    waits while any party is still a client (a push of its own would close it), and closes with the fold alone
    once the last has left (``Departures.last_gone``): the model moves by the late delta."""
    server = GlobalServer(Decoupled(quorum=2, grace=0.0, stale_rounds=1), [0.0])
    server.push("dc0", [1.0], tokens=1, at=0.0)
    server.push("dc1", [1.0], tokens=1, at=0.1)
    model = server.model.copy()
    server.push("dc2", [4.0], tokens=2, at=0.5)
    for party in ("dc0", "dc1"):
        server.table.clients.leave(party)
        server.tick(1.0)
    assert server.table.completed(Kind.PUSHPULL, 0, 0) == 1, "dc2 is still a client: its next push may come"
    assert server.table.clients.leave("dc2")
    server.tick(1.1)
    assert server.table.completed(Kind.PUSHPULL, 0, 0) == 2
    np.testing.assert_allclose(server.model, model + 4.0, rtol=1e-6)
    report = server.rule.report()
    assert report["late_folded"] == {"dc2": 1} and len(server.answered("dc2")) == 1
    assert report["last_rounds"][-1] == {"key": 0, "slice": 0, "round": 1, "quorum": [], "missing": [], "lost": [],
                                         "folded": ["dc2"]}


def test_a_lost_party_leaves_the_quorum_and_its_restart_is_on_time_from_its_init() -> None:
    """quorum 3 of 3, and dc2 dies: the rounds close once every live party is in (a quorum above the live parties
    shrinks to them, at once: no grace) and count dc2 lost. Restarted, dc2 is a new client of the same name, awaited
    by the rounds that open after it is back; its INIT brings the current model and counts every round released so
    far as seen, so its first push is on time for the open round (not dropped as many rounds late). The report shows
    the party, by its name, lost then back; once it has shut down it is gone, not lost."""
    server = GlobalServer(Decoupled(quorum=3, grace=10.0, stale_rounds=1), [0.0])
    for party in PARTIES:
        server.push(party, [1.0], tokens=1, at=0.0)
    server.table.clients.drop("dc2", "heartbeats stopped")
    for number in range(1, 4):
        server.push("dc0", [1.0], tokens=1, at=float(number))
        server.push("dc1", [1.0], tokens=1, at=number + 0.1)
        assert server.table.completed(Kind.PUSHPULL, 0, 0) == number + 1, "no wait for the dead party"
    server.names["dc2#1"] = "dc2"
    server.table.clients.add("dc2#1")
    server.stored[(0, 0)] = SliceValue(server.model.copy())
    init = Message(Kind.INIT, key=0, dtype="float32", shape=(1,), body={"shard": 0})
    init.sender = b"dc2#1"
    Inits(server, is_global=True).request(init)
    np.testing.assert_array_equal(server.answered("dc2#1")[-1], server.model)  # the current model
    before = server.model.copy()
    server.push("dc0", [1.0], tokens=1, at=5.0)
    server.push("dc1", [1.0], tokens=1, at=5.1)
    assert server.table.completed(Kind.PUSHPULL, 0, 0) == 4, "the rejoined party is awaited again"
    server.push("dc2#1", [4.0], tokens=1, at=5.2)
    assert server.table.completed(Kind.PUSHPULL, 0, 0) == 5
    np.testing.assert_allclose(server.model, before + weighted([([1.0], 1), ([1.0], 1), ([4.0], 1)]), rtol=1e-6)
    report = server.rule.report(server.display)
    assert report["by_party"]["dc2"] == {"on_time": 2, "missed": 0, "lost": 3, "late_folded": 0, "dropped": 0}
    assert [r["lost"] for r in report["last_rounds"]] == [[], ["dc2"], ["dc2"], ["dc2"], []]
    assert report["last_rounds"][-1]["quorum"] == ["dc0", "dc1", "dc2"]
    server.table.clients.leave("dc2#1")  # it finished and shut down: gone, but not lost
    server.push("dc0", [1.0], tokens=1, at=6.0)
    server.push("dc1", [1.0], tokens=1, at=6.1)
    assert server.rule.report(server.display)["last_rounds"][-1]["lost"] == []


def test_the_token_weighted_merge_matches_the_simulation_with_unequal_tokens() -> None:
    server = GlobalServer(Decoupled(quorum=3, grace=0.0), [0.0, 0.0, 0.0])
    parts = [([0.3, -1.0, 2.0], 7), ([1.5, 0.25, -0.5], 1), ([-0.7, 0.9, 0.1], 24)]
    for (delta, tokens), party in zip(parts, PARTIES, strict=True):
        server.push(party, delta, tokens=tokens, at=0.0)
    np.testing.assert_allclose(server.model, weighted(parts), rtol=1e-6)


def test_tokens_proportional_to_workers_give_todays_weighted_sum_bit_for_bit() -> None:
    """Today a local server sends ``(average - global) * float32(n_p / N)`` and the global server sums; decoupled
    it sends the plain delta and its tokens: with tokens proportional to workers the merge is the same bits."""
    rng = np.random.default_rng(3)
    deltas = [rng.standard_normal(1000).astype(np.float32) for _ in PARTIES]
    workers, steps = [2, 1, 4], 12
    today = deltas[0] * np.float32(workers[0] / 7)
    for delta, n in zip(deltas[1:], workers[1:], strict=True):
        today = np.add(today, delta * np.float32(n / 7))
    server = GlobalServer(Decoupled(quorum=3, grace=0.0), [0.0] * 1000)
    server.model = np.zeros(1000, dtype=np.float32)
    for delta, n, party in zip(deltas, workers, PARTIES, strict=True):
        server.push(party, list(delta), tokens=n * steps, at=0.0)
    np.testing.assert_array_equal(server.model, today)


def test_grace_auto_follows_the_last_full_rounds_spread_within_its_bound() -> None:
    server = GlobalServer(Decoupled(quorum=2, grace=None), [0.0])
    assert server.rule.grace() == GRACE_AUTO_MAX_S  # nothing seen yet: wait up to the bound
    for party, at in zip(PARTIES, (0.0, 0.2, 0.5), strict=True):
        server.push(party, [1.0], tokens=1, at=at)
    assert server.rule.grace() == pytest.approx(0.3)  # from the quorum's arrival (0.2) to the last (0.5)
    server.push("dc0", [1.0], tokens=1, at=3.0)
    server.push("dc1", [1.0], tokens=1, at=3.1)
    server.tick(3.35)
    assert server.table.completed(Kind.PUSHPULL, 0, 0) == 1
    server.tick(3.45)  # the grace (0.3) since the quorum (3.1) has passed: dc2 missed it
    assert server.table.completed(Kind.PUSHPULL, 0, 0) == 2
    server.push("dc2", [1.0], tokens=1, at=3.1 + 0.8)  # one round late, by 0.8 s
    assert server.rule.grace() == pytest.approx(0.8)  # the window grows again to catch it (a 2.9 s period)
    for party, at in zip(PARTIES, (6.0, 6.1, 6.6), strict=True):  # round 2 waits for dc2 now
        server.push(party, [1.0], tokens=1, at=at)
    assert server.table.completed(Kind.PUSHPULL, 0, 0) == 3 and server.rule.report()["closed_by_grace"] == 1


def test_grace_auto_waits_at_most_a_share_of_the_quorums_round_period() -> None:
    """A window as long as most of a round would hold the quorum's answer past the local round where its parties
    land it: once a round's period is known, auto waits at most PERIOD_SHARE of it, however late a party came."""
    server = GlobalServer(Decoupled(quorum=2, grace=None), [0.0])
    for party, at in zip(PARTIES, (0.0, 0.2, 3.0), strict=True):  # round 0: dc2 2.8 s after the quorum, caught
        server.push(party, [1.0], tokens=1, at=at)
    assert server.rule.grace() == pytest.approx(2.8)  # no period known yet
    server.push("dc0", [1.0], tokens=1, at=3.1)
    server.push("dc1", [1.0], tokens=1, at=3.2)  # round 1's quorum, 3.0 s after round 0's
    server.push("dc2", [1.0], tokens=1, at=4.0)
    assert server.table.completed(Kind.PUSHPULL, 0, 0) == 2
    assert server.rule.grace() == pytest.approx(0.8)  # the spreads 2.8 and 0.8, bounded by 0.4 x 3.0 = 1.2
    server.push("dc0", [1.0], tokens=1, at=4.2)
    server.push("dc1", [1.0], tokens=1, at=4.3)  # round 2's quorum
    server.tick(4.3 + 0.8)
    assert server.table.completed(Kind.PUSHPULL, 0, 0) == 3, "closed by the bounded window (2.8 s would wait on)"
    assert server.rule.report()["missed"] == {"dc2": 1}


def test_grace_auto_gives_up_on_parties_later_than_its_bound() -> None:
    """Spreads beyond the bound are parties the window would not catch: it does not wait for them."""
    server = GlobalServer(Decoupled(quorum=2, grace=None), [0.0])
    server.push("dc0", [1.0], tokens=1, at=0.0)
    server.push("dc1", [1.0], tokens=1, at=0.1)
    server.tick(0.1 + GRACE_AUTO_MAX_S)  # no spread seen yet: it waited the bound
    assert server.table.completed(Kind.PUSHPULL, 0, 0) == 1
    server.push("dc2", [1.0], tokens=1, at=0.1 + 3 * GRACE_AUTO_MAX_S)  # one round late, beyond the bound
    assert server.rule.grace() == 0.0


def test_without_a_quorum_nothing_changes() -> None:
    aggregation = HfaAggregation(None, None, hips=True)  # type: ignore[arg-type]
    assert aggregation.round_rule() is None and aggregation.up_body((0, 0)) is None
    assert decoupled_options({}) == Decoupled() and not Decoupled().on


@pytest.mark.parametrize(("training", "problem"), [
    ({"quorum": 0}, "quorum must be at least 1"),
    ({"quorum": 3}, r"quorum \(3\) must not exceed the job's parties \(2\)"),
    ({"quorum": "two"}, "option 'quorum' of the hfa aggregation must be an integer"),
    ({"quorum": 2, "grace": "soon"}, r"grace must be auto or seconds \(0.5, 500ms\), got 'soon'"),
    ({"quorum": 2, "grace": "-1"}, "grace must be auto or seconds >= 0"),
    ({"quorum": 2, "stale_rounds": -1}, "stale_rounds must be at least 0"),
    ({"grace": "auto"}, "grace applies to decoupled rounds only: set quorum too"),
])
def test_bad_decoupled_options_are_refused_by_name(training: dict[str, Any], problem: str) -> None:
    topology = topology_from_dict({"parties": {"dc0": 1, "dc1": 1}, "hfa": {"k1": 2, "k2": 4}, "training": training})
    with pytest.raises(ConfigError, match=problem):
        check_plugins(topology.training, topology)


def test_decoupled_rounds_refuse_what_they_do_not_run_yet() -> None:
    topology = topology_from_dict({"parties": {"dc0": 1, "dc1": 1}, "hfa": {"k1": 2, "k2": 4},
                                   "training": {"quorum": 1}, "tsengine": {"inter": False, "intra": True}})
    with pytest.raises(ConfigError, match="do not run with tsengine yet"):
        check_plugins(topology.training, topology)


@pytest.mark.parametrize("parties", [
    {"dc0": 1, "dc1": {"workers": 2, "lan": "collective"}},
    {"dc0": {"workers": 2, "lan": "collective"}, "dc1": {"workers": 2, "lan": "collective"}},
], ids=["mixed", "every_party_collective"])
def test_decoupled_rounds_take_collective_parties(parties: dict[str, Any]) -> None:
    topology = topology_from_dict({"parties": parties, "hfa": {"k1": 2, "k2": 4},
                                   "training": {"quorum": 1, "grace": "0", "fragments": 2, "fragment_delay": 1}})
    check_plugins(topology.training, topology)


def test_a_collective_partys_ranks_are_one_client_of_a_slices_rounds_and_of_the_report() -> None:
    """dc2 is lan: collective: the rank owning slice 0 pushes it for the party. A round awaits the party, not each
    rank; its late push is answered at once, to the rank that sent it, and folded in; the report and the round's
    history name the party's client, never the rank (a server names a rank's connection after the rank)."""
    server = GlobalServer(Decoupled(quorum=2, grace=1.0, stale_rounds=1), [0.0])
    clients = Clients(["dc0", "dc1"])
    clients.group("dc2/ranks", "dc2", ["dc2/r0", "dc2/r1"])
    server.table.clients = clients
    server.names.update({"dc2/r0": "dc2/worker0", "dc2/r1": "dc2/worker1"})
    server.push("dc0", [1.0], tokens=2, at=0.0)
    server.push("dc1", [1.0], tokens=2, at=0.1)
    server.push("dc2/r0", [2.0], tokens=4, at=0.2)  # rank 1 owns no part of slice 0: the round is complete
    assert server.table.completed(Kind.PUSHPULL, 0, 0) == 1 and server.rule.report()["closed_by_grace"] == 0
    after_0 = server.model.copy()
    server.push("dc0", [1.0], tokens=2, at=1.0)
    server.push("dc1", [1.0], tokens=2, at=1.1)
    server.tick(2.2)
    assert server.table.completed(Kind.PUSHPULL, 0, 0) == 2
    after_1 = server.model.copy()
    server.push("dc2/r0", [8.0], tokens=4, at=2.5)  # from round 0's model: one round late
    np.testing.assert_array_equal(server.answered("dc2/r0")[-1], after_1)  # at once, to the owning rank
    server.push("dc0", [1.0], tokens=2, at=3.0)
    server.push("dc1", [1.0], tokens=2, at=3.1)
    server.tick(4.2)
    np.testing.assert_allclose(server.model, after_1 + weighted([([1.0], 2), ([1.0], 2), ([8.0], 4)]), rtol=1e-6)
    assert not np.array_equal(after_0, after_1)
    report = server.rule.report(server.display)
    assert sorted(report["by_party"]) == ["dc0", "dc1", "dc2/ranks"]
    assert report["by_party"]["dc2/ranks"] == {"on_time": 1, "missed": 2, "lost": 0, "late_folded": 1, "dropped": 0}
    assert report["last_rounds"][-1]["folded"] == ["dc2/ranks"]
    assert report["last_rounds"][-2]["missing"] == ["dc2/ranks"]


def test_decoupled_options_are_parsed_once_for_every_node() -> None:
    topology = topology_from_dict({"parties": {"dc0": 1, "dc1": 1}, "hfa": {"k1": 2, "k2": 4},
                                   "training": {"quorum": 1, "grace": "0.25", "stale_rounds": 2}})
    check_plugins(topology.training, topology)
    options = dict(topology.training.plugin_options)
    assert decoupled_options(options, 2) == Decoupled(quorum=1, grace=0.25, stale_rounds=2)
    without_hfa = topology_from_dict({"parties": {"dc0": 1}, "training": {"quorum": 1}})
    with pytest.raises(ConfigError, match=r"\['quorum'\].*taken by no plug-in"):
        check_plugins(without_hfa.training, without_hfa)


def local_server(make_server: Any, k2: int = 4, quorum: int = 1, parties: int = 2) -> HfaAggregation:
    """A local server's HFA under a quorum of ``quorum`` of ``parties`` (no fragment_delay), global model zeros."""
    server = make_server("dc0/server", ["w0", "w1"], upstream=["gs"])
    decoupled = Decoupled(quorum=quorum, grace=0.0)
    hfa = HfaAggregation(server, LocalFrequencyAggregation(k2=k2, party_weight=1.0), hips=True, decoupled=decoupled)
    hfa.on_arrival = lands_on_arrival(decoupled, parties, delay=0, k2=k2)
    hfa.adopted((0, 0), np.zeros(2, dtype=np.float32))
    return hfa


def local_round(hfa: HfaAggregation, average: list[float], tokens: list[int | None]) -> Any:
    """One local round of slice (0, 0): the workers' pushes (with their tokens) collected, then ``upward``."""
    rnd = Round(Kind.PUSHPULL, 0, 0)
    for index, count in enumerate(tokens):
        rnd.contributions[f"w{index}"] = Message(Kind.PUSHPULL, body=None if count is None else {TOKENS: count})
    hfa.collected(rnd)
    return hfa.upward((0, 0), np.array(average, dtype=np.float32))


def test_below_every_party_the_answer_lands_at_the_first_local_round_after_it_arrives(make_server: Any) -> None:
    """The party never waits for the global round: it goes on from its average and lands the new model when it is
    in; only the round before the slice's next global one waits for it (the next delta needs it)."""
    hfa = local_server(make_server, k2=4)
    for _ in range(3):
        assert isinstance(local_round(hfa, [1, 1], [5, 5]), Answer)
    sent = local_round(hfa, [2, 4], [5, 5])  # round 4: global, the workers go on at once
    assert isinstance(sent, SendUpAndAnswer)
    np.testing.assert_array_equal(sent.send, [2, 4])  # unweighted: the global server weighs it by tokens
    np.testing.assert_array_equal(sent.answer, [2, 4])
    assert hfa.up_body((0, 0)) == {TOKENS: 40}  # 4 local rounds of 2 workers x 5 samples
    assert hfa.up_body((0, 0)) == {TOKENS: 0}, "counted from the last global push on"
    step = local_round(hfa, [3, 3], [1, None])  # round 5: no answer yet: the party's average, no wait
    assert isinstance(step, Answer)
    np.testing.assert_array_equal(step.answer, [3, 3])
    hfa.adopted((0, 0), np.array([7, 7], dtype=np.float32))
    landed = local_round(hfa, [4, 4], [1, 1])  # round 6: the answer is in: it lands
    assert isinstance(landed, Answer) and hfa.in_flight == {}
    np.testing.assert_array_equal(landed.answer, [7, 7])
    assert hfa.tokens == {(0, 0): 4}, "a push that reports no tokens counts 1"


def test_the_round_before_the_next_global_one_waits_for_a_missing_answer(make_server: Any) -> None:
    hfa = local_server(make_server, k2=2)
    local_round(hfa, [1, 1], [1, 1])
    assert isinstance(local_round(hfa, [2, 2], [1, 1]), SendUpAndAnswer)  # round 2: global
    assert isinstance(local_round(hfa, [3, 3], [1, 1]), AwaitAnswer)  # round 3: the last before round 4
    hfa.adopted((0, 0), np.array([5, 5], dtype=np.float32))
    np.testing.assert_array_equal(hfa.resumed((0, 0)), [5, 5])


@pytest.mark.parametrize(("quorum", "parties", "delay", "k2", "lands"), [
    (1, 2, 0, 4, True), (2, 2, 0, 4, False), (0, 2, 0, 4, False), (1, 2, 1, 4, False), (1, 2, 0, 1, False)])
def test_answers_land_on_arrival_only_below_every_party_without_an_overlap_of_its_own(
        quorum: int, parties: int, delay: int, k2: int, lands: bool) -> None:
    assert lands_on_arrival(Decoupled(quorum=quorum), parties, delay, k2) is lands
