"""The server core's round table and membership, driven in one process by a fake host (no sockets)."""

from __future__ import annotations

from collections.abc import Collection

import numpy as np
import pytest

from geomx.algorithms.fsa.server import FullySynchronous
from geomx.algorithms.ssp.server import BoundedStaleness
from geomx.core.clients import Clients
from geomx.core.early import EARLY, EarlyAnswers, send_early
from geomx.core.policy import SyncPolicy
from geomx.core.rounds import ALONE, Round, RoundTable
from geomx.protocol.wire import Flag, Kind, Message


class EveryClient(SyncPolicy):
    name = "every_client"
    synchronous = True

    def round_complete(self, contributors: Collection[str], awaited: Collection[str]) -> bool:
        return set(awaited) <= set(contributors)

    def rescale(self, total: np.ndarray, present: int, full: int) -> np.ndarray:
        return total


class EveryPush(SyncPolicy):
    name = "every_push"
    clients_leave_independently = True

    def round_complete(self, contributors: Collection[str], awaited: Collection[str]) -> bool:
        return len(contributors) >= 1

    def rescale(self, total: np.ndarray, present: int, full: int) -> np.ndarray:
        return total


class FakeHost:
    """Records what the table sends; answers a completed round with its sum unless told to hold it."""

    name = "fake"

    def __init__(self, answer: bool = True) -> None:
        self.answer = answer
        self.sent: list[tuple[str, Message]] = []
        self.completed: list[Round] = []
        self.redelivered: list[Message] = []
        self.early: list[tuple[str, int, int]] = []  # (client, request id, open round) answered early
        self.done = 0
        self.table: RoundTable | None = None

    def send(self, peer: str, message: Message) -> None:
        self.sent.append((peer, message))

    def complete(self, rnd: Round) -> None:
        assert rnd.forwarding
        self.completed.append(rnd)
        if self.answer and self.table is not None:
            self.table.release(rnd, rnd.accum)

    def redeliver(self, message: Message) -> None:
        self.redelivered.append(message)
        assert self.table is not None
        self.table.contribute(message)

    def display(self, client: str) -> str:
        return client.upper()

    def answer_early(self, rnd: Round, message: Message) -> None:
        self.early.append((message.sender.decode(), message.request_id, rnd.number))

    def all_done(self) -> None:
        self.done += 1


class LeadOfTwo(EveryClient):
    """Rounds wait for everyone, but a client may run up to two rounds ahead of the last completed one."""

    def may_answer(self, ahead: int) -> bool:
        return ahead <= 2


def make(clients: list[str], policy: SyncPolicy | None = None, answer: bool = True,
         now: list[float] | None = None) -> tuple[FakeHost, RoundTable]:
    host = FakeHost(answer)
    clock = (lambda: now[0]) if now is not None else (lambda: 0.0)
    host.table = RoundTable(host, Clients(clients), policy or EveryClient(), clock=clock)
    return host, host.table


def push(sender: str, values: list[float], key: int = 0, dtype: str = "float32", kind: Kind = Kind.PUSHPULL,
         request_id: int = 1) -> Message:
    tensor = np.array(values, dtype=dtype) if values else None
    message = Message(kind, key=key, tensor=tensor, request_id=request_id)
    message.sender = sender.encode()
    return message


def replies(host: FakeHost) -> dict[str, Message]:
    return {peer: message for peer, message in host.sent}


def test_a_round_waits_for_every_client_and_answers_each_with_the_sum() -> None:
    host, table = make(["a", "b", "c"])
    table.contribute(push("a", [1, 2]))
    table.contribute(push("b", [10, 20]))
    assert host.completed == [] and host.sent == []
    table.contribute(push("c", [100, 200]))
    assert len(host.completed) == 1
    answers = replies(host)
    assert set(answers) == {"a", "b", "c"}
    for message in answers.values():
        assert message.flags & Flag.REPLY and message.kind is Kind.PUSHPULL
        np.testing.assert_array_equal(message.tensor, [111, 222])
    assert table.completed(Kind.PUSHPULL, 0, 0) == 1


def test_the_first_buffer_is_not_written_and_half_precision_sums_in_float32() -> None:
    host, table = make(["a", "b"], answer=False)
    first = np.array([1, 2], dtype=np.float32)
    first.flags.writeable = False
    message = push("a", [])
    message.tensor = first
    table.contribute(message)
    table.contribute(push("b", [1, 1]))
    np.testing.assert_array_equal(first, [1, 2])
    np.testing.assert_array_equal(host.completed[0].accum, [2, 3])

    host, table = make(["a", "b"], answer=False)
    table.contribute(push("a", [60000], dtype="float16"))
    table.contribute(push("b", [60000], dtype="float16"))
    assert host.completed[0].accum.dtype == np.float32 and host.completed[0].accum[0] == 120000


def test_a_second_push_from_one_client_waits_for_the_next_round() -> None:
    host, table = make(["a", "b"])
    table.contribute(push("a", [1], request_id=1))
    table.contribute(push("a", [5], request_id=2))  # the next round's
    assert host.completed == []
    table.contribute(push("b", [2], request_id=1))
    first = [m for peer, m in host.sent]
    assert [m.request_id for m in first] == [1, 1] and float(first[0].tensor[0]) == 3
    assert [m.request_id for m in host.redelivered] == [2]  # replayed into round 1
    rnd = table.get(Kind.PUSHPULL, 0, 0)
    assert rnd is not None and rnd.number == 1 and set(rnd.contributions) == {"a"}


def test_pushes_follow_the_policy_and_other_kinds_wait_for_everyone() -> None:
    host, table = make(["a", "b"], policy=EveryPush())
    table.contribute(push("a", [1]))
    assert len(host.completed) == 1  # a push is its own round
    table.contribute(push("a", [], kind=Kind.BARRIER))
    assert len(host.completed) == 1  # a barrier still waits for b
    table.contribute(push("b", [], kind=Kind.BARRIER))
    assert len(host.completed) == 2 and host.completed[1].kind is Kind.BARRIER


def test_a_late_answer_for_a_round_that_moved_on_is_dropped() -> None:
    host, table = make(["a"], answer=False)
    table.contribute(push("a", [1]))
    rnd = host.completed[0]
    table.release(rnd, None, "timed out")
    assert host.sent[-1][1].kind is Kind.ERROR
    sent = len(host.sent)
    table.release(rnd, np.ones(1), number=0)  # the tier above answers round 0 after it failed
    assert len(host.sent) == sent and rnd.number == 1


def test_a_dropped_client_no_longer_holds_up_the_rounds_and_is_refused() -> None:
    host, table = make(["a", "b"])
    table.contribute(push("a", [1]))
    assert table.clients.drop("b", "heartbeats stopped") == {"a"}
    table.complete_ready()
    assert set(replies(host)) == {"a"}
    assert table.clients.refusal("b", "B") == \
        "B was dropped from the job (heartbeats stopped); restart its party to rejoin"
    assert table.clients.refusal("a", "A") is None
    table.clients.leave("a")
    assert table.clients.refusal("a", "A") == "A has already shut down"


def test_a_client_that_joins_while_a_round_is_open_is_not_awaited_by_it() -> None:
    host, table = make(["a", "b"])
    table.contribute(push("a", [1]))
    table.exempt_open("c")
    table.clients.add("c")
    table.contribute(push("b", [2]))
    assert set(replies(host)) == {"a", "b"}  # round 0 did not wait for c
    host.sent.clear()
    table.contribute(push("a", [1]))
    table.contribute(push("b", [2]))
    assert host.sent == []  # round 1 does
    table.contribute(push("c", [3]))
    assert set(replies(host)) == {"a", "b", "c"}


def test_held_joiners_take_part_from_the_next_cycle_with_their_requests_replayed() -> None:
    host, table = make(["a"])
    table.clients.add("j", hold=True)
    early = push("j", [7])
    assert table.clients.hold(early) and not table.clients.hold(push("a", [1]))
    table.contribute(push("a", [1]))
    assert set(replies(host)) == {"a"}  # a held joiner is not awaited
    host.sent.clear()
    table.admit()
    assert host.redelivered == [early]
    table.contribute(push("a", [1]))
    assert set(replies(host)) == {"a", "j"}


def test_only_held_joiners_left_are_admitted_when_the_others_go() -> None:
    host, table = make(["a"])
    table.clients.add("j", hold=True)
    table.clients.hold(push("j", [7]))
    table.clients.leave("a")
    table.complete_ready()
    assert "j" not in table.clients.joining and len(host.redelivered) == 1
    assert set(replies(host)) == {"j"}


def test_a_round_past_its_deadline_fails_naming_the_missing_clients() -> None:
    now = [0.0]
    host, table = make(["a", "b", "c"], now=now)
    table.contribute(push("a", [1]))
    now[0] = 5.0
    table.expire(round_s=10, request_s=1)
    assert host.sent == []
    now[0] = 10.5
    table.expire(round_s=10, request_s=1)
    error = replies(host)["a"]
    assert error.kind is Kind.ERROR
    assert error.body == {"error": "fake: PUSHPULL round 0 of key 0 slice 0 timed out after 10 s waiting for "
                                   "clients ['B', 'C']"}


def test_a_forwarded_round_has_the_request_deadline() -> None:
    now = [0.0]
    host, table = make(["a"], answer=False, now=now)
    table.contribute(push("a", [1]))
    now[0] = 1.5
    table.expire(round_s=10, request_s=1)
    assert "waiting for the global server to answer" in replies(host)["a"].body["error"]


def test_failing_the_open_rounds_answers_their_clients_and_a_shutdown_round_ends_the_server() -> None:
    host, table = make(["a", "b"])
    table.contribute(push("a", [1]))
    table.fail_open("global_server0 is dead")
    assert replies(host)["a"].body == {"error": "fake: global_server0 is dead"}
    table.contribute(push("a", [], kind=Kind.SHUTDOWN))
    table.contribute(push("b", [], kind=Kind.SHUTDOWN))
    assert host.done == 1


@pytest.mark.parametrize("number", [0, 3])
def test_a_restored_count_carries_on(number: int) -> None:
    _, table = make(["a"])
    table.restore(Kind.PUSHPULL, 4, 1, number)
    assert table.completed(Kind.PUSHPULL, 4, 1) == number
    message = push("a", [1], key=4)
    message.slice = 1
    table.contribute(message)
    assert table.completed(Kind.PUSHPULL, 4, 1) == number + 1


def test_a_client_answered_early_queues_its_next_pushes_in_order_and_is_not_answered_twice() -> None:
    host, table = make(["a", "b"], policy=LeadOfTwo())
    for request_id in (1, 2, 3):  # a's rounds 0, 1 and 2 while b has pushed nothing
        table.contribute(push("a", [request_id], request_id=request_id))
    assert host.early == [("a", 1, 0), ("a", 2, 0)]  # the third would run 3 rounds ahead: it waits
    assert host.completed == [] and host.sent == []
    table.contribute(push("b", [10], request_id=7))  # round 0 completes: a's first push and b's applied
    assert [(peer, m.request_id) for peer, m in host.sent] == [("b", 7)]  # a was answered already
    assert float(host.sent[0][1].tensor[0]) == 11
    # a's queued pushes were replayed in order: request 2 into round 1 (answered before), request 3 queued
    # behind it and now only 2 rounds ahead of the last completed one: answered
    assert host.early == [("a", 1, 0), ("a", 2, 0), ("a", 3, 1)]
    rnd = table.get(Kind.PUSHPULL, 0, 0)
    assert rnd is not None and rnd.number == 1 and rnd.contributions["a"].request_id == 2
    assert [m.request_id for m in rnd.deferred] == [3]
    table.contribute(push("b", [20], request_id=8))
    assert float(host.sent[-1][1].tensor[0]) == 22 and len(host.sent) == 2  # round 1 = a's 2 + b's 20
    assert table.leads_report() == {"A": {"1": 1, "2": 2}, "B": {"0": 2}}


def test_without_may_answer_a_second_push_waits_and_every_answer_is_at_its_release() -> None:
    host, table = make(["a", "b"])
    table.contribute(push("a", [1], request_id=1))
    table.contribute(push("a", [2], request_id=2))
    table.contribute(push("b", [3], request_id=1))
    table.contribute(push("b", [4], request_id=2))
    assert host.early == [] and [m.request_id for _, m in host.sent] == [1, 1, 2, 2]
    assert table.leads_report() == {"A": {"0": 2}, "B": {"0": 2}}


# -- bounded staleness (dist_ssp) ------------------------------------------------------------------------
def _run(policy: SyncPolicy, fast_steps_per_slow_step: int,
         rounds: int) -> tuple[FakeHost, RoundTable, list[int], list[float]]:
    """A fast client "a" and a slow one "b" (it pushes once per ``fast_steps_per_slow_step`` chances), each
    pushing its next round only once answered. Returns (host, the lead before each of a's pushes, the sum of
    each completed round as answered to b)."""
    host, table = make(["a", "b"], policy=policy)
    pushed = {"a": 0, "b": 0}
    leads = []
    tick = 0
    while pushed["b"] < rounds:
        tick += 1
        answered = {m.request_id for peer, m in host.sent if peer == "a"} | {r for c, r, _ in host.early if c == "a"}
        # a pushes round k (request id k + 1) once its request k was answered
        if pushed["a"] < rounds and (pushed["a"] == 0 or pushed["a"] in answered):
            leads.append(pushed["a"] - table.completed(Kind.PUSHPULL, 0, 0))
            table.contribute(push("a", [1.0 + pushed["a"]], request_id=pushed["a"] + 1))
            pushed["a"] += 1
        answered_b = {m.request_id for peer, m in host.sent if peer == "b"}
        if tick % fast_steps_per_slow_step == 0 and (pushed["b"] == 0 or pushed["b"] in answered_b):
            table.contribute(push("b", [100.0 * (1 + pushed["b"])], request_id=pushed["b"] + 1))
            pushed["b"] += 1
    sums = [float(m.tensor[0]) for peer, m in host.sent if peer == "b"]
    return host, table, leads, sums


@pytest.mark.parametrize("staleness", [0, 1, 2, 4])
def test_a_three_times_faster_client_runs_at_most_s_rounds_ahead_and_rounds_sum_as_fsa(staleness: int) -> None:
    host, table, leads, sums = _run(BoundedStaleness(staleness), fast_steps_per_slow_step=3, rounds=8)
    assert max(leads) == staleness  # reached the bound, never beyond it
    assert sums == [101.0 * (k + 1) for k in range(8)]  # every round: a's k-th push + b's k-th push
    report = table.leads_report()
    assert max(int(lead) for lead in report["A"]) == staleness and set(report["B"]) == {"0"}
    fsa_host, _, fsa_leads, fsa_sums = _run(FullySynchronous(), fast_steps_per_slow_step=3, rounds=8)
    if staleness == 0:  # the same answers, in the same order, as FSA
        assert [(p, m.request_id, float(m.tensor[0])) for p, m in host.sent] == \
               [(p, m.request_id, float(m.tensor[0])) for p, m in fsa_host.sent] and host.early == []
        assert leads == fsa_leads
    assert sums == fsa_sums


def test_an_early_answer_is_the_last_applied_value() -> None:
    host, table = make(["a", "b"], policy=BoundedStaleness(1))
    table.contribute(push("a", [1.0], request_id=1))
    assert host.early == [("a", 1, 0)]  # answered while round 0 waits for b
    table.contribute(push("a", [2.0], request_id=2))  # round 1's: 2 ahead, it waits
    assert host.early == [("a", 1, 0)]
    table.contribute(push("b", [10.0], request_id=1))
    assert host.early == [("a", 1, 0), ("a", 2, 1)] and [(p, m.request_id) for p, m in host.sent] == [("b", 1)]


# -- early answers (geomx.core.early): the last party gets the others' sum first, then a bare answer


def _three_parties_early() -> tuple[dict[str, np.ndarray], Message, dict[str, Message]]:
    """a and b push, c gets their sum early, then pushes: (values, the early message, the answers)."""
    host, table = make(["a", "b", "c"])
    rng = np.random.default_rng(0)
    values = {name: rng.standard_normal(1000).astype(np.float32) for name in "abc"}
    table.contribute(push("a", list(values["a"])))
    rnd = table.get(Kind.PUSHPULL, 0, 0)
    send_early(host, rnd, table.awaited(rnd))
    assert host.sent == []  # two clients still missing
    table.contribute(push("b", list(values["b"])))
    send_early(host, rnd, table.awaited(rnd))
    send_early(host, rnd, table.awaited(rnd))  # once per round
    assert [peer for peer, _ in host.sent] == ["c"]
    early_message = host.sent[0][1]
    assert not early_message.is_reply and early_message.body == {EARLY: 0}
    early_message.sender = b"global"
    table.contribute(push("c", list(values["c"])))  # completes: the sum is added to in place
    answers = replies(host)
    assert rnd.early is None and rnd.number == 1  # the next round starts clean
    for message in answers.values():
        message.sender = b"global"
    return values, early_message, answers


@pytest.mark.parametrize("early_first", [True, False], ids=["sum-before-push", "push-before-sum"])
def test_the_last_party_answers_with_the_others_sum_plus_its_own_bit_for_bit(early_first: bool) -> None:
    values, early_message, answers = _three_parties_early()
    assert answers["c"].is_reply and answers["c"].tensor is None and answers["c"].body == {EARLY: 0}
    assert answers["a"].tensor is not None and answers["a"].body is None
    local, got = EarlyAnswers(), []
    if early_first:
        local.store("global", early_message)
        local.forwarded("global", 0, 0, values["c"], got.append)
    else:
        local.forwarded("global", 0, 0, values["c"], got.append)
        assert got == []  # waits for the others' sum
        local.store("global", early_message)
    assert len(got) == 1 and np.array_equal(got[0], answers["a"].tensor)  # bit for bit the global sum
    assert local.settled("global", answers["c"])  # the bare answer closes it
    assert not local.settled("global", answers["c"])  # once


def test_an_ordinary_answer_goes_on_and_a_full_answer_after_an_early_one_is_an_error() -> None:
    values, early_message, answers = _three_parties_early()
    local, got = EarlyAnswers(), []
    local.forwarded("global", 0, 0, values["a"], got.append)  # a was not last: no early sum comes
    assert not local.settled("global", answers["a"]) and got == []
    local.store("global", early_message)
    local.forwarded("global", 0, 0, values["c"], got.append)
    with pytest.raises(ValueError, match="in full after its early sum"):
        local.settled("global", answers["a"])  # a tensor where a bare answer was due


def test_a_round_of_one_answers_its_pusher_with_its_own_push() -> None:
    """``ALONE``: the others' sum is empty, so the bare answer releases the waiting push as it was pushed; an
    ``ALONE`` answer to a push this server never forwarded is an error, not a silent wrong model."""
    pushed, got, local = np.arange(4, dtype=np.float32), [], EarlyAnswers()
    local.forwarded("global", 0, 0, pushed, got.append)
    bare = Message(Kind.PUSHPULL, key=0, slice=0).reply(body={EARLY: 3, ALONE: True})
    assert local.settled("global", bare) and len(got) == 1 and got[0] is pushed
    with pytest.raises(ValueError, match="never sent"):
        local.settled("global", bare)


def test_a_round_of_pushes_is_timed_from_its_first_contribution_to_its_answers() -> None:
    """The round's duration lands in its bucket (``ROUND_BUCKETS_S``: upper bounds, one more above the last), for
    the status page's histogram; a failed round or another kind's is not counted."""
    from geomx.protocol.bodies import ROUND_BUCKETS_S

    now = [100.0]
    _, table = make(["a", "b"], now=now)
    table.contribute(push("a", [1.0]))
    now[0] += 0.02  # the second contribution completes it: 20 ms after the first
    table.contribute(push("b", [2.0]))
    counts = table.times.counts
    assert len(counts) == len(ROUND_BUCKETS_S) + 1 and sum(counts) == 1
    assert counts[ROUND_BUCKETS_S.index(0.025)] == 1 and table.times.seconds == pytest.approx(0.02)
    table.contribute(push("a", [], kind=Kind.BARRIER, request_id=2))
    table.contribute(push("b", [], kind=Kind.BARRIER, request_id=2))
    table.contribute(push("a", [1.0], request_id=3))
    now[0] += 60.0
    table.fail_open("gone")
    assert sum(table.times.counts) == 1  # neither the barrier nor the failed round
    table.contribute(push("a", [1.0], request_id=4))
    now[0] += 100.0
    table.contribute(push("b", [1.0], request_id=4))
    assert table.times.counts[-1] == 1  # above the last bound


# -- push staleness (MixedSync: pushes applied on arrival) -----------------------------------------------
def test_a_pushs_staleness_is_the_updates_of_its_slice_applied_since_its_senders_last_answer() -> None:
    from geomx.algorithms.mixed_sync.server import Asynchronous

    _, table = make(["a", "b"], policy=Asynchronous())
    table.contribute(push("a", [1]))  # a's first push: nothing applied before it
    for _ in range(3):  # a three times faster than b: each of its pushes follows its own answer
        table.contribute(push("a", [1]))
    table.contribute(push("b", [1]))  # b's model is the initial one: 4 of a's updates were applied since
    table.contribute(push("a", [1]))  # b's update came since a's last answer
    table.contribute(push("b", [1]))  # a's one
    other = push("a", [1], key=3)  # another key counts its own updates
    table.contribute(other)
    assert table.reports()["staleness"] == {"A": {"0": 5, "1": 1}, "B": {"1": 1, "4": 1}}
    assert table.reports()["leads"] == {"A": {"0": 6}, "B": {"0": 2}}


def test_a_resumed_count_is_not_staleness_and_a_synchronous_policy_counts_none() -> None:
    from geomx.algorithms.mixed_sync.server import Asynchronous

    _, table = make(["a"], policy=Asynchronous())
    table.restore(Kind.PUSHPULL, 0, 0, 40)  # rounds before the restart: every client has the checkpoint's value
    table.contribute(push("a", [1]))
    assert table.reports()["staleness"] == {"A": {"0": 1}}
    _, table = make(["a", "b"], policy=FullySynchronous())
    table.contribute(push("a", [1]))
    table.contribute(push("b", [1]))
    assert table.reports()["staleness"] == {}


def test_a_joiner_held_for_the_round_under_way_is_admitted_when_every_slice_released_it() -> None:
    host, table = make(["a", "b"])
    for key in (0, 1):  # a first round of both slices
        table.contribute(push("a", [1], key=key))
        table.contribute(push("b", [1], key=key))
    assert not table.hold_until_round_ends("x")  # between two rounds: taken at once
    table.clients.add("c", hold=True)  # held for another reason (an algorithm's cycle): stays held below
    table.contribute(push("a", [1], key=0))
    assert table.hold_until_round_ends("j")  # slice 0's round 1 is open
    table.contribute(push("b", [1], key=0))
    first = push("j", [5], key=0)
    assert table.clients.hold(first) and "j" in table.clients.joining  # slice 1 has not released round 1 yet
    table.contribute(push("a", [1], key=1))
    table.contribute(push("b", [1], key=1))  # ... now it has: j is admitted, its push replayed into round 2
    assert host.redelivered == [first] and "j" not in table.clients.joining and "c" in table.clients.joining
    assert table.rounds[(Kind.PUSHPULL, 0, 0)].contributions.keys() == {"j"}


def test_no_joiner_is_held_under_a_policy_whose_rounds_do_not_wait_for_every_client() -> None:
    _, table = make(["a", "b"], policy=EveryPush())
    table.contribute(push("a", [1], key=0))
    table.contribute(push("a", [1], key=1))
    table.contribute(push("a", [1], key=0))
    assert not table.hold_until_round_ends("j")
