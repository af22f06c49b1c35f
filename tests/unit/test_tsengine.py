"""TSEngine's coordinator: ε-greedy choices at the configured rate, throughput from wall-clock time, relays."""

from __future__ import annotations

import pytest

from geomx.algorithms.tsengine.rules import Coordinator, PushPairing


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def measured(coordinator: Coordinator, clock: Clock, rates: dict[str, float], nbytes: int = 1000) -> None:
    """Give the coordinator one measurement of gs -> each target at the given bytes per second."""
    for target, rate in rates.items():
        round_ = coordinator.start("gs", {target: 0}, nbytes)
        assert coordinator.next_target(round_, "gs") == target
        clock.now += nbytes / rate
        assert coordinator.acknowledged(round_, target) == "gs"


@pytest.mark.parametrize("greed", [0.9, 0.5, 0.0])
def test_exploration_happens_at_one_minus_max_greed(greed):
    clock = Clock()
    coordinator = Coordinator(max_greed=greed, seed=3, clock=clock)
    measured(coordinator, clock, {"a": 1e6, "b": 2e6, "c": 3e6})
    coordinator.choices.forced = 0
    picks = [coordinator.choose("gs", ["a", "b", "c"]) for _ in range(4000)]
    explore = coordinator.choices.explore / 4000
    assert explore == pytest.approx(1 - greed, abs=0.03)  # GeoMX's integer division never explores
    # exploitation picks the fastest measured link; exploration is uniform
    share_c = picks.count("c") / 4000
    assert share_c == pytest.approx(greed + (1 - greed) / 3, abs=0.03)


def test_unknown_links_are_forced_exploration_and_throughput_is_bytes_over_wall_time():
    clock = Clock()
    coordinator = Coordinator(max_greed=1.0, seed=0, clock=clock)
    assert coordinator.choose("gs", ["a", "b"]) in ("a", "b")
    assert coordinator.choices.forced == 1
    measured(coordinator, clock, {"a": 5e5}, nbytes=1000)
    assert coordinator.throughput[("gs", "a")] == pytest.approx(5e5)
    measured(coordinator, clock, {"a": 1e6}, nbytes=1000)  # EMA 0.5
    assert coordinator.throughput[("gs", "a")] == pytest.approx(7.5e5)


def test_a_round_reaches_every_target_once_through_relays():
    clock = Clock()
    coordinator = Coordinator(max_greed=0.9, seed=1, clock=clock)
    targets = {f"ls{i}": 7 for i in range(5)}
    round_ = coordinator.start("gs", targets, nbytes=100)
    holders = ["gs"]
    served = []
    while not round_.done:
        holder = holders.pop(0)
        target = coordinator.next_target(round_, holder)
        if target is None:
            continue
        clock.now += 0.01
        assert coordinator.acknowledged(round_, target) == holder
        served.append(target)
        holders += [holder, target]  # both may serve again: a tree forms
    assert sorted(served) == sorted(targets)
    assert coordinator.rounds_done == 1 and len(round_.hops) == 5
    assert any(holder != "gs" for holder, _ in round_.hops)  # some local server relayed
    assert coordinator.acknowledged(round_, "ls0") is None  # a second ack is ignored


def test_greed_is_validated():
    with pytest.raises(ValueError, match="MAX_GREED_RATE_TS"):
        Coordinator(max_greed=1.5)


def test_waiting_local_servers_pair_up_while_the_global_server_receives():
    coordinator = Coordinator(max_greed=0.9, seed=2)
    pairing = PushPairing()
    assert coordinator.ask_push(pairing, "a") == [("a", None)]  # the link is free: straight to the server
    assert coordinator.ask_push(pairing, "b") == []  # busy: b waits
    (sender, receiver), = coordinator.ask_push(pairing, "c")  # c and b pre-merge, one into the other
    assert {sender, receiver} == {"b", "c"} and coordinator.merges == 1
    assert coordinator.ask_push(pairing, receiver) == []  # the receiver asks again with the merged sum: waits
    assert coordinator.pushed(pairing) == [(receiver, None)]  # a's push arrived: the receiver may send
    assert coordinator.pushed(pairing) == [] and not pairing.busy  # everything arrived: the link is free


def test_merge_direction_follows_measured_throughput():
    coordinator = Coordinator(max_greed=1.0, seed=0)
    coordinator.throughput[("a", "b")] = 1e6
    coordinator.throughput[("b", "a")] = 5e6
    assert all(coordinator.merge_direction("a", "b") == ("b", "a") for _ in range(20))


def test_a_dropped_client_is_forgotten_by_both_overlays():
    """Elastic FSA drops a dead worker: its relays go back to the unserved, the root serves again when nobody
    else is sending, and a push the server waited for no longer blocks the ones waiting."""
    coordinator = Coordinator(max_greed=1.0, seed=0)
    round_ = coordinator.start("ls", {"w1": 0, "w2": 0, "w3": 0}, nbytes=100)
    first = coordinator.next_target(round_, "ls")
    coordinator.acknowledged(round_, first)
    relayed = coordinator.next_target(round_, first)  # first relays to another worker ...
    assert coordinator.forget_target(round_, first) == ["ls"]  # ... and dies: nobody sends, the root does
    assert relayed in round_.unserved and first not in round_.unserved | set(round_.in_flight)
    while (target := coordinator.next_target(round_, "ls")) is not None:
        coordinator.acknowledged(round_, target)
    assert round_.done and coordinator.rounds_done == 1

    pairing = PushPairing()
    assert coordinator.ask_push(pairing, "w1") == [("w1", None)]
    assert coordinator.ask_push(pairing, "w2") == []
    assert coordinator.forget_pusher(pairing, "w3") == []  # not involved: nothing changes
    assert coordinator.forget_pusher(pairing, "w1") == [("w2", None)]  # w1 died before pushing: w2 may send
    assert coordinator.forget_pusher(pairing, "w2") == [] and not pairing.busy
