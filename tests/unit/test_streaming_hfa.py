"""Streaming outer sync on HFA (fragments, overlap, mix): the schedule, the aggregation's answers, the server's
rounds that wait for an overlapped send, and the options' checks, in one process with fake hosts."""

from __future__ import annotations

import itertools
from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from geomx.algorithms.hfa.rules import LocalFrequencyAggregation, streaming_options
from geomx.algorithms.hfa.server import HfaAggregation
from geomx.codecs import default_registry
from geomx.config import ConfigError, TrainingSpec, topology_from_dict
from geomx.core.encoding import Encoding
from geomx.core.plugins import Answer, AwaitAnswer, Route, SendUp, SendUpAndAnswer, SendUpAndAwait
from geomx.core.rounds import SliceValue
from geomx.core.strategy import SIGNATURE_KEY, STEP_KEY
from geomx.protocol.wire import Kind, Message
from geomx.server.compose import check_plugins
from geomx.server.pushpull import PushPulls


def test_fragments_split_the_slices_by_size_and_go_global_at_staggered_rounds() -> None:
    hfa = LocalFrequencyAggregation(k2=4, party_weight=1.0, fragments=2)
    assert hfa.needs_fragments
    hfa.assign_fragments({(0, 0): 100, (1, 0): 10, (2, 0): 100, (3, 0): 10, (2, 1): 50})
    assert not hfa.needs_fragments
    groups = [hfa.fragment(sid) for sid in [(0, 0), (2, 0), (2, 1), (1, 0), (3, 0)]]
    assert groups == [0, 1, 0, 1, 1]  # largest first, each to the lighter group: 150 and 120 elements
    # group 0 goes global at rounds 2, 6, ...; group 1 at 4, 8, ...: each slice once every K2 rounds
    assert [r for r in range(1, 9) if hfa.goes_global((0, 0), r)] == [2, 6]
    assert [r for r in range(1, 9) if hfa.goes_global((2, 0), r)] == [4, 8]
    assert hfa.fragment((9, 0)) == 1  # a slice the split did not see goes by its key


def test_the_wrappers_keys_take_no_fragment() -> None:
    """A tiny model beside the wrapper's signature (98 elements) and step: the split is the model's two slices, one
    fragment each (counted as slices, the signature was a fragment alone and both layers the other: nothing
    streamed); the wrapper's keys go global at the rounds a multiple of K2, as without streaming."""
    hfa = LocalFrequencyAggregation(k2=6, party_weight=0.5, fragments=2)
    hfa.assign_fragments({(0, 0): 1, (1, 0): 1, (SIGNATURE_KEY, 0): 98, (STEP_KEY, 0): 1})
    assert [hfa.fragment((0, 0)), hfa.fragment((1, 0))] == [0, 1]
    for key in (SIGNATURE_KEY, STEP_KEY):
        assert [r for r in range(1, 13) if hfa.goes_global((key, 0), r)] == [6, 12]


def test_fragments_of_many_slices_are_runs_that_ranks_dealt_in_turn_share_evenly() -> None:
    """The scale job's case: many equal slices, dealt to a party's 2 ranks in turn. Each of 4 fragments is made of
    runs of consecutive slices, about a quarter of a fragment each, strided over the model's depth; each rank owns
    about half of every fragment (groups dealt slice by slice gave every fragment to one rank)."""
    from geomx.collective.owners import SliceOwners

    sizes = {(key, index): 1000 for key in range(10) for index in range(33)}
    hfa = LocalFrequencyAggregation(k2=8, party_weight=0.5, fragments=4)
    hfa.assign_fragments(sizes)
    owners = SliceOwners(world_size=2)
    owners.add_many([(key, [(i * 1000, (i + 1) * 1000) for i in range(33)], 4) for key in range(10)])
    order = sorted(sizes)
    groups = [hfa.fragment(sid) for sid in order]
    runs = 1 + sum(a != b for a, b in itertools.pairwise(groups))
    assert 16 <= runs <= 17  # runs of at most 330000 / 16 elements (20 slices), not 330 alternations
    assert groups[:4 * 20:20] == [0, 1, 2, 3]  # dealt in turn: each fragment's runs spread over the depth
    for fragment in range(4):
        ranks = [owners.owner(*sid) for sid in order if hfa.fragment(sid) == fragment]
        assert abs(len(ranks) - len(order) / 4) <= 20
        assert abs(ranks.count(0) - ranks.count(1)) <= 4, (fragment, ranks.count(0), ranks.count(1))


def test_one_fragment_is_plain_hfa() -> None:
    hfa = LocalFrequencyAggregation(k2=3, party_weight=1.0)
    assert not hfa.needs_fragments
    assert [r for r in range(1, 10) if hfa.goes_global((5, 2), r)] == [3, 6, 9]


@pytest.mark.parametrize(("k2", "fragments"), [(4, 0), (2, 3)])
def test_fragments_out_of_range_are_refused(k2: int, fragments: int) -> None:
    with pytest.raises(ValueError, match="fragments"):
        LocalFrequencyAggregation(k2=k2, party_weight=1.0, fragments=fragments)


def local_hfa(make_server: Any, delay: int, alpha: float = 0.0, k2: int = 2) -> HfaAggregation:
    server = make_server("dc0/server", ["w0"], upstream=["gs"])
    hfa = HfaAggregation(server, LocalFrequencyAggregation(k2=k2, party_weight=1.0), hips=True, delay=delay,
                         alpha=alpha)
    hfa.adopted((0, 0), np.zeros(2, dtype=np.float32))
    return hfa


def floats(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def test_an_overlapped_global_round_answers_the_average_now_and_the_new_model_delay_rounds_later(
        make_server: Any) -> None:
    hfa = local_hfa(make_server, delay=1)
    assert isinstance(hfa.upward((0, 0), floats(1, 1)), Answer)  # round 1: local
    sent = hfa.upward((0, 0), floats(2, 4))  # round 2: global, overlapped
    assert isinstance(sent, SendUpAndAnswer)
    np.testing.assert_array_equal(sent.send, [2, 4])  # the delta from the global model (zeros)
    np.testing.assert_array_equal(sent.answer, [2, 4])  # the workers go on from the party's average
    hfa.adopted((0, 0), floats(10, 10))  # the new global model arrives before round 3
    mixed = hfa.upward((0, 0), floats(3, 5))  # round 3: the overlap ends with the new global model (alpha 0)
    assert isinstance(mixed, Answer)
    np.testing.assert_array_equal(mixed.answer, [10, 10])
    assert hfa.in_flight == {}
    # round 4 goes global again, its delta taken from the new global model
    again = hfa.upward((0, 0), floats(12, 13))
    assert isinstance(again, SendUpAndAnswer)
    np.testing.assert_array_equal(again.send, [2, 3])


def test_a_due_round_waits_for_the_answer_then_mixes_with_its_average(make_server: Any) -> None:
    hfa = local_hfa(make_server, delay=1, alpha=0.25)
    hfa.upward((0, 0), floats(1, 1))
    hfa.upward((0, 0), floats(2, 4))  # sent, overlapped
    assert isinstance(hfa.upward((0, 0), floats(4, 8)), AwaitAnswer)  # round 3: no answer yet
    hfa.adopted((0, 0), floats(8, 0))
    np.testing.assert_allclose(hfa.resumed((0, 0)), [0.75 * 8 + 0.25 * 4, 0.25 * 8])
    assert hfa.in_flight == {}


def test_without_delay_a_global_round_waits_for_the_global_model(make_server: Any) -> None:
    hfa = local_hfa(make_server, delay=0)
    hfa.upward((0, 0), floats(1, 1))
    step = hfa.upward((0, 0), floats(2, 4))
    assert isinstance(step, SendUp) and hfa.in_flight == {}
    np.testing.assert_array_equal(step.send, [2, 4])


def test_without_delay_alpha_mixes_the_global_model_with_the_rounds_average(make_server: Any) -> None:
    """torchft's fragment_update_alpha at fragment_sync_delay 0: the round waits for the new global model, then
    answers ``(1 - alpha) * global + alpha * average`` (once ignored without a delay)."""
    hfa = local_hfa(make_server, delay=0, alpha=0.25)
    hfa.upward((0, 0), floats(1, 1))
    step = hfa.upward((0, 0), floats(4, 8))
    assert isinstance(step, SendUpAndAwait)
    np.testing.assert_array_equal(step.send, [4, 8])
    hfa.adopted((0, 0), floats(8, 0))
    np.testing.assert_allclose(hfa.resumed((0, 0)), [0.75 * 8 + 0.25 * 4, 0.25 * 8])
    assert hfa.in_flight == {} and hfa.local is not None and hfa.local.global_model((0, 0)).tolist() == [8, 0]


class PushPullHost:
    """What PushPulls asks of a local server, around the unit tests' fake server and a real aggregation."""

    def __init__(self, server: Any, aggregation: HfaAggregation) -> None:
        self.server = server
        self.aggregation = aggregation
        self.encoding = Encoding()
        self.route = Route()
        self.codecs = default_registry()
        self.is_global = False
        self.config = SimpleNamespace(num_workers=1, topology=SimpleNamespace(num_all_workers=1))
        self.sent: list[tuple[str, Message]] = []
        self.van = SimpleNamespace(peer_party=lambda client: None,
                                   send=lambda peer, message: self.sent.append((peer, message)))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.server, name)


def push_round(host: PushPullHost, value: np.ndarray) -> Any:
    """One worker's push of key 0, completed into a round, handed to PushPulls."""
    server = host.server
    server.table.contribute(Message(Kind.PUSHPULL, key=0, slice=0, num_slices=1, tensor=value,
                                    sender=b"w0", request_id=len(server.completed) + 1))
    rnd = server.completed[-1]
    rnd.accum = value
    return rnd


def answered(server: Any) -> list[tuple[Any, ...]]:
    return [(number, None if value is None else value.tolist(), error) for number, value, error, _ in server.released]


def overlapping_server(make_server: Any) -> tuple[Any, PushPullHost, PushPulls]:
    """A local server of one worker whose key 0 goes global every 2nd round, overlapped by one round."""
    server = make_server("dc0/server", ["w0"], upstream=["gs"])
    server.stored = {(0, 0): SliceValue(np.zeros(2, dtype=np.float32))}
    hfa = HfaAggregation(server, LocalFrequencyAggregation(k2=2, party_weight=1.0), hips=True, delay=1)
    hfa.adopted((0, 0), np.zeros(2, dtype=np.float32))
    host = PushPullHost(server, hfa)
    pushpulls = PushPulls(host)  # type: ignore[arg-type]
    return server, host, pushpulls


def test_the_server_answers_an_overlapped_round_at_once_and_a_due_round_when_the_answer_arrives(
        make_server: Any) -> None:
    server, host, pushpulls = overlapping_server(make_server)
    pushpulls.complete(push_round(host, floats(1, 1)))
    pushpulls.complete(push_round(host, floats(2, 4)))  # global, overlapped: answered at once, sent up
    assert answered(server) == [(0, [1, 1], None), (1, [2, 4], None)]
    (peer, message, then), = server.calls
    assert peer == "gs" and message.kind is Kind.PUSHPULL and message.tensor.tolist() == [2, 4]
    pushpulls.complete(push_round(host, floats(3, 3)))  # due: waits for the global server
    assert len(server.released) == 2 and (0, 0) in pushpulls.waiting
    reply: Future[Message] = Future()
    reply.set_result(message.reply(tensor=floats(7, 9)))
    then(reply)
    assert answered(server)[-1] == (2, [7, 9], None) and server.stored[(0, 0)].value.tolist() == [7, 9]


def test_the_server_answers_a_mixing_round_once_the_global_model_is_in(make_server: Any) -> None:
    server, host, pushpulls = overlapping_server(make_server)
    hfa = host.aggregation
    hfa.delay, hfa.alpha = 0, np.float32(0.5)
    pushpulls.complete(push_round(host, floats(1, 1)))
    pushpulls.complete(push_round(host, floats(2, 4)))  # global: sent up, the workers wait for the mix
    assert answered(server) == [(0, [1, 1], None)] and (0, 0) in pushpulls.waiting
    (peer, message, then), = server.calls
    assert peer == "gs" and message.tensor.tolist() == [2, 4]
    reply: Future[Message] = Future()
    reply.set_result(message.reply(tensor=floats(6, 8)))
    then(reply)
    assert answered(server)[-1] == (1, [4, 6], None) and hfa.local.global_model((0, 0)).tolist() == [6, 8]


def test_a_failed_overlapped_send_answers_the_waiting_round_and_every_later_one_with_its_error(
        make_server: Any) -> None:
    server, host, pushpulls = overlapping_server(make_server)
    pushpulls.complete(push_round(host, floats(1, 1)))  # round 1: local
    pushpulls.complete(push_round(host, floats(2, 2)))  # round 2: sent, overlapped
    pushpulls.complete(push_round(host, floats(3, 3)))  # round 3: due, waits
    failed: Future[Message] = Future()
    failed.set_exception(TimeoutError("no answer from gs in 30 s"))
    server.calls[0][2](failed)
    number, value, error = answered(server)[-1]
    assert (number, value) == (2, None) and "overlapped send failed" in error and "no answer from gs" in error
    pushpulls.complete(push_round(host, floats(4, 4)))  # round 4 would go up again: the error instead
    assert "no answer from gs" in (answered(server)[-1][2] or "") and len(server.calls) == 1


def test_the_jobs_model_waits_for_an_overlapped_send_then_holds_its_answer(make_server: Any) -> None:
    server, host, pushpulls = overlapping_server(make_server)
    pushpulls.complete(push_round(host, floats(1, 1)))
    pushpulls.complete(push_round(host, floats(2, 4)))  # global, overlapped: its send is on its way
    ask = Message(Kind.PULL, key=0, slice=0, num_slices=1, sender=b"w0", request_id=99)
    pushpulls.on_held_pull(ask)
    assert host.sent == []  # the delta on its way is in no model the party holds yet
    (_, message, then), = server.calls
    reply: Future[Message] = Future()
    reply.set_result(message.reply(tensor=floats(7, 9)))
    then(reply)
    (peer, answer), = host.sent
    assert peer == "w0" and answer.request_id == 99 and answer.tensor.tolist() == [7, 9]
    pushpulls.on_held_pull(ask)  # nothing on its way now: answered at once
    assert len(host.sent) == 2 and host.sent[-1][1].tensor.tolist() == [7, 9]


def test_the_jobs_model_of_a_failed_overlapped_send_is_its_error(make_server: Any) -> None:
    server, host, pushpulls = overlapping_server(make_server)
    pushpulls.complete(push_round(host, floats(1, 1)))
    pushpulls.complete(push_round(host, floats(2, 4)))  # global, overlapped: its send is on its way
    pushpulls.on_held_pull(Message(Kind.PULL, key=0, slice=0, num_slices=1, sender=b"w0", request_id=99))
    failed: Future[Message] = Future()
    failed.set_exception(TimeoutError("no answer from gs in 30 s"))
    server.calls[0][2](failed)
    (_, answer), = host.sent
    assert answer.kind is Kind.ERROR and "no answer from gs" in answer.body["error"]


HFA_TOPOLOGY = {"parties": {"dc0": 1, "dc1": 1}, "hfa": {"k1": 2, "k2": 4}}


@pytest.mark.parametrize(("options", "problem"), [
    ({"fragments": "5"}, "must not exceed HFA's K2"),
    ({"fragments": "2", "fragment_delay": "4"}, r"below HFA's K2 \(4\)"),
    ({"fragment_alpha": "1.5"}, "between 0 and 1"),
    ({"fragment_delay": "-1"}, "at least 0"),
    ({"fragments": "two"}, "must be an integer"),
])
def test_streaming_options_are_checked_against_the_jobs_k2(options: dict[str, str], problem: str) -> None:
    topology = topology_from_dict({**HFA_TOPOLOGY, "training": options})
    with pytest.raises(ConfigError, match=problem):
        check_plugins(topology.training, topology)


@pytest.mark.parametrize("route", [{"tsengine": True}, {"dgt": True}], ids=["tsengine", "dgt"])
def test_overlapped_fragments_never_meet_a_route_they_would_skip(route: dict[str, bool]) -> None:
    """An overlapped send goes straight to the slice's owner (server.pushpull), not through the local server's
    route: the routes (TSEngine between parties, DGT) do not combine with HFA at all, refused at load."""
    with pytest.raises(ConfigError, match="does not combine with HFA"):
        topology_from_dict({**HFA_TOPOLOGY, **route, "training": {"fragments": 2, "fragment_delay": 1}})


def test_a_ranks_streaming_options_are_refused_with_the_servers_words() -> None:
    """A collective party's ranks read the options through ``streaming_options`` (no local server checks them)."""
    topology = topology_from_dict({**HFA_TOPOLOGY, "training": {"fragment_alpha": 1.5}})
    with pytest.raises(ConfigError) as refused:
        check_plugins(topology.training, topology)
    with pytest.raises(ValueError) as on_rank:
        streaming_options(dict(topology.training.plugin_options), 4)
    assert str(on_rank.value) in str(refused.value)


def test_streaming_options_need_hfa() -> None:
    check_plugins(TrainingSpec(plugin_options=(("fragments", "2"), ("fragment_delay", "1"))),
                  topology_from_dict({**HFA_TOPOLOGY, "training": {"fragments": 2, "fragment_delay": 1}}))
    without_hfa = topology_from_dict({"parties": {"dc0": 1}, "training": {"fragments": 2}})
    with pytest.raises(ConfigError, match=r"\['fragments'\].*taken by no plug-in"):
        check_plugins(without_hfa.training, without_hfa)
