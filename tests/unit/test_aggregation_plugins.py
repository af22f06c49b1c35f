"""HFA's aggregation and ESync's state rounds as plug-ins, driven in one process by a fake server host."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import numpy as np
import pytest

from geomx.algorithms.esync.kinds import STATE
from geomx.algorithms.esync.server import StateRounds
from geomx.algorithms.hfa.rules import LocalFrequencyAggregation
from geomx.algorithms.hfa.server import HfaAggregation
from geomx.algorithms.mixed_sync.server import Asynchronous
from geomx.codecs import default_registry
from geomx.codecs.messages import decode_message
from geomx.core.plugins import Aggregation, Answer, SendUp
from geomx.core.rounds import MODEL_CHANGE, Round
from geomx.protocol.wire import Kind, Message


def test_the_plain_sum_sends_the_sum_up_and_answers_with_it() -> None:
    plain = Aggregation()
    total = np.array([1.0, 2.0], dtype=np.float32)
    step = plain.upward((0, 0), total)
    assert isinstance(step, SendUp) and step.send is total and plain.gradient(total) is total
    assert plain.combine(np.zeros(2), total) is total and plain.push_kind == "gradient"


def test_a_local_tier_answers_inside_the_party_until_every_k2th_round(make_server: Any) -> None:
    server = make_server("dc0/server", ["w0"], upstream=["gs"])
    hfa = HfaAggregation(server, LocalFrequencyAggregation(k2=2, party_weight=0.5), hips=True)
    hfa.adopted((0, 0), np.zeros(2, dtype=np.float32))
    local_round = hfa.upward((0, 0), np.array([4.0, 4.0], dtype=np.float32))  # round 1: the average here
    assert isinstance(local_round, Answer)
    np.testing.assert_array_equal(local_round.answer, [4.0, 4.0])
    global_round = hfa.upward((0, 0), np.array([4.0, 6.0], dtype=np.float32))  # round 2: the weighted delta
    assert isinstance(global_round, SendUp)  # answered by the global server
    np.testing.assert_array_equal(global_round.send, [2.0, 3.0])
    assert hfa.push_kind == "delta" and hfa.answers_weights


def test_the_global_model_moves_by_the_deltas_or_an_optimizer_steps_against_them(make_server: Any) -> None:
    hfa = HfaAggregation(make_server("gs", ["ls0"]), None, hips=True)
    np.testing.assert_array_equal(hfa.combine(np.ones(2), np.array([1.0, -1.0])), [2.0, 0.0])
    np.testing.assert_array_equal(hfa.gradient(np.array([1.0, -1.0])), [-1.0, 1.0])


def model_change_setup(make_server: Any) -> tuple[Any, HfaAggregation, Round]:
    server = make_server("gs", ["ls0", "ls1"])
    server.wan_codec = default_registry().make_codec({"type": "bsc", "threshold": 0.5, "size_lower_bound": 0})
    rnd = Round(Kind.PUSHPULL, 3, 0, number=4)
    return server, HfaAggregation(server, None, hips=True), rnd


def test_under_a_residual_codec_the_answer_is_the_models_change_and_a_local_tier_rebuilds_it(
        make_server: Any) -> None:
    _, hfa, rnd = model_change_setup(make_server)
    previous = np.zeros(8, dtype=np.float32)
    value = np.arange(8, dtype=np.float32)
    fields = hfa.answer_fields(rnd, value, previous)
    assert fields is not None and fields["body"][MODEL_CHANGE] is True
    reply = Message(Kind.PUSHPULL, key=3, **fields)
    reply.tensor = decode_message(default_registry(), reply)
    local_server = make_server("dc0/server", ["w0"], upstream=["gs"])
    local = HfaAggregation(local_server, LocalFrequencyAggregation(k2=1, party_weight=0.5), hips=True)
    assert local.answered((3, 0), reply) is not None  # no global model known yet: an error names it
    local.adopted((3, 0), np.ones(8, dtype=np.float32))
    change = reply.tensor.copy()
    assert local.answered((3, 0), reply) is None
    np.testing.assert_allclose(reply.tensor, 1 + change)


def test_the_model_changes_size_gate_is_the_whole_tensors(make_server: Any) -> None:
    """A slice below Bi-Sparse's bound of a tensor above it: the change is sparsified (its residual kept); the
    same slice of a small tensor travels as a plain model."""
    server, hfa, rnd = model_change_setup(make_server)
    server.wan_codec = default_registry().make_codec({"type": "bsc", "threshold": 0.25, "size_lower_bound": 12})
    value, previous = np.arange(8, dtype=np.float32), np.zeros(8, dtype=np.float32)
    server.tensor_sizes[rnd.key] = 16  # two slices of 8
    fields = hfa.answer_fields(rnd, value, previous)
    assert fields is not None and fields["body"][MODEL_CHANGE] is True
    server.tensor_sizes[rnd.key] = 8
    assert hfa.answer_fields(rnd, value, previous) is None


def test_no_model_change_where_parties_do_not_get_every_answer(make_server: Any) -> None:
    server, hfa, rnd = model_change_setup(make_server)
    server.table.policy = Asynchronous()
    assert hfa.answer_fields(rnd, np.ones(8, dtype=np.float32), np.zeros(8, dtype=np.float32)) is None
    flat = HfaAggregation(make_server("gs", ["w0"]), None, hips=False)
    server.table.policy = flat.host.table.policy
    assert flat.answer_fields(rnd, np.ones(8, dtype=np.float32), np.zeros(8, dtype=np.float32)) is None


def state(sender: str, speeds: Any, base: Any = 2) -> Message:
    message = Message(STATE, body={"seconds_per_step": speeds, "base_steps": base})
    message.sender = sender.encode()
    return message


@pytest.mark.parametrize("bad", [{}, {"w": "fast"}, {"w": True}])
def test_a_malformed_speed_report_is_refused(make_server: Any, bad: Any) -> None:
    server = make_server("gs", ["ls0"])
    StateRounds(server, is_top=True).on_state(state("ls0", bad))
    assert server.refused == ["STATE needs {'seconds_per_step': {worker: seconds}, 'base_steps': int}"]


def test_the_top_tier_assigns_steps_to_everyone_and_ends_the_cycle(make_server: Any) -> None:
    server = make_server("gs", ["ls0", "ls1"])
    rounds = StateRounds(server, is_top=True)
    server.complete = lambda rnd: rounds.completions()[rnd.kind](rnd)
    server.clients.add("late", hold=True)
    rounds.on_state(state("ls0", {"dc0/w0": 0.01}))
    rounds.on_state(state("ls1", {"dc1/w0": 0.03}))
    steps = {peer: m.body for peer, m in server.sent}
    assert steps == {"ls0": {"steps": {"dc0/w0": 6, "dc1/w0": 2}}, "ls1": {"steps": {"dc0/w0": 6, "dc1/w0": 2}}}
    assert server.clients.joining == {}  # the rejoined client takes part from the next cycle


def test_a_lower_tier_merges_its_reports_into_one_request_up(make_server: Any) -> None:
    server = make_server("dc0/server", ["w0", "w1"], upstream=["gs"])
    rounds = StateRounds(server, is_top=False)
    server.complete = lambda rnd: rounds.completions()[rnd.kind](rnd)
    rounds.on_state(state("w0", {"dc0/w0": 0.01}, base=1))
    rounds.on_state(state("w1", {"dc0/w1": 0.02}, base=3))
    (peer, up, then), = server.calls
    assert peer == "gs" and up.body == {"seconds_per_step": {"dc0/w0": 0.01, "dc0/w1": 0.02}, "base_steps": 3}
    answer: Future[Message] = Future()
    answer.set_result(Message(STATE, body={"steps": {"dc0/w0": 2, "dc0/w1": 1}}))
    then(answer)
    assert {peer for peer, _ in server.sent} == {"w0", "w1"}
    assert all(m.body == {"steps": {"dc0/w0": 2, "dc0/w1": 1}} for _, m in server.sent)
