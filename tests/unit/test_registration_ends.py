"""Registrations that cannot complete end with one true line: a scheduler whose connection dropped is not described
as running (transport/reach.py), and its gone process or its refusal ends the wait at once (cluster/membership.py);
a party registered twice with the global scheduler is refused once its first self shows it still runs
(cluster/scheduler.py)."""

from __future__ import annotations

import time
from concurrent.futures import Future
from types import SimpleNamespace

import pytest
import zmq

from geomx.cluster import membership
from geomx.cluster.membership import GLOBAL_SCHEDULER_ID, JoinRefused
from geomx.cluster.scheduler import Scheduler
from geomx.config import LanTier, NodeConfig, PartySpec, Role, Topology
from geomx.protocol.wire import Kind, Message
from geomx.transport.reach import Reach
from geomx.transport.rpc import RemoteError

ADDRESS = "127.0.0.1:9000"


def dropped_reach(refused: int) -> Reach:
    """A scheduler that answered the handshake, then stopped: the events its DEALER's monitor reports (as seen
    from a real peer killed by SIGKILL: the first retry after the drop only schedules the reconnection)."""
    reach = Reach(f"tcp://{ADDRESS}", "none")
    for event in (zmq.EVENT_CONNECTED, zmq.EVENT_HANDSHAKE_SUCCEEDED, zmq.EVENT_DISCONNECTED):
        reach.note(event, 0)
    for _ in range(refused + 1):
        reach.note(zmq.EVENT_CONNECT_RETRIED, 150)
    return reach


def test_a_dropped_connection_is_not_described_as_a_running_peer():
    reach = dropped_reach(refused=2)
    assert not reach.handshaken and reach.dropped
    assert reach.describe() == ("it was connected, then the connection dropped; nothing listens there since "
                                "(connection refused, 2 tries)")
    assert not reach.gone  # two refusals: not yet sure that it ended
    reach.note(zmq.EVENT_CONNECT_RETRIED, 150)
    assert reach.gone


def test_a_dropped_connection_that_comes_back_is_a_running_peer_again():
    reach = dropped_reach(refused=1)
    reach.note(zmq.EVENT_CONNECTED, 0)
    reach.note(zmq.EVENT_HANDSHAKE_SUCCEEDED, 0)
    assert not reach.dropped and not reach.gone and reach.describe().startswith("it runs")
    reach.note(zmq.EVENT_DISCONNECTED, 0)  # dropped again: no refusal counted yet
    assert reach.describe() == "it was connected, then the connection dropped" and not reach.gone


def test_a_protocol_failure_of_a_dropped_peer_is_not_called_a_security_mismatch():
    reach = dropped_reach(refused=0)
    reach.note(zmq.EVENT_CONNECTED, 0)
    reach.note(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, 0)  # cut mid-handshake as it stops
    assert reach.refusal is None


def fake_van(reach: Reach | None) -> SimpleNamespace:
    reaches = {GLOBAL_SCHEDULER_ID: reach} if reach is not None else {}
    return SimpleNamespace(name="dc1/server", watches=SimpleNamespace(reaches=reaches))


def test_a_scheduler_gone_ends_the_registration_wait_at_once_naming_it():
    started = time.monotonic()
    with pytest.raises(JoinRefused) as caught:
        membership._await_book(fake_van(dropped_reach(refused=3)), Future(), 60.0, ADDRESS, GLOBAL_SCHEDULER_ID)
    assert time.monotonic() - started < 10.0  # not the register timeout (60 s)
    assert str(caught.value) == (
        f"[dc1/server] the global scheduler at {ADDRESS} stopped before this node's registration completed: it was "
        "connected, then the connection dropped; nothing listens there since (connection refused, 3 tries); did it "
        "fail or was it stopped? (its own log says why)")


def test_a_refused_registration_is_one_line_naming_the_scheduler():
    future: Future[Message] = Future()
    future.set_exception(RemoteError("global_scheduler refused the request: party 'dc1' is already registered"))
    with pytest.raises(JoinRefused, match=rf"^\[dc1/server\] the global scheduler at {ADDRESS} refused this node's "
                                          r"registration: party 'dc1' is already registered$"):
        membership._await_book(fake_van(None), future, 60.0, ADDRESS, GLOBAL_SCHEDULER_ID)


# -- the global scheduler, fed REGISTERs and heartbeats without a network (its van is never started) -----------------


@pytest.fixture
def scheduler(monkeypatch):
    """A complete job of dc0 (a server party, central) and dc1 (a collective party of two ranks); refusals and
    rejoins are recorded, not sent."""
    topology = Topology(parties=(PartySpec("dc0", 1), PartySpec("dc1", 2, lan=LanTier.COLLECTIVE)), central="dc0")
    sched = Scheduler(NodeConfig(role=Role.GLOBAL_SCHEDULER, party="dc0", topology=topology,
                                 global_scheduler=ADDRESS))
    sched.refused, sched.rejoined = [], []
    monkeypatch.setattr(sched, "_refuse", lambda sender, *_args: sched.refused.append((sender, _args[-1])))
    monkeypatch.setattr(sched, "_rejoin", lambda sender, old, _reg: sched.rejoined.append((sender, old.id)))
    for sender, role, party, rank in (("gs", Role.GLOBAL_SERVER, "dc0", 0), ("dc0-server", Role.LOCAL_SERVER, "dc0", 0),
                                      ("dc1-rank0", Role.WORKER, "dc1", 0), ("dc1-rank1", Role.WORKER, "dc1", 1)):
        register(sched, sender, role, party, rank)
    assert sched._complete.is_set() and not sched.refused
    yield sched
    sched.van.stop()


def register(sched: Scheduler, sender: str, role: Role, party: str, rank: int | None) -> None:
    body = {"role": role.value, "party": party, "address": "tcp://127.0.0.1:1", "rank": rank, "master": False}
    sched._on_message(Message(Kind.REGISTER, body=body, request_id=1, sender=sender.encode()))


def heartbeat(sched: Scheduler, sender: str) -> None:
    assert sched._on_heartbeat(Message(Kind.HEARTBEAT, request_id=2, sender=sender.encode()))


def registered_long_ago(sched: Scheduler) -> None:
    """The waiting registrations arrived 10 s ago (their old selves' heartbeats since then are news)."""
    sched._waiting = [(since - 10.0, sender, reg) for since, sender, reg in sched._waiting]


@pytest.mark.parametrize(("role", "party", "rank", "words"), [
    (Role.WORKER, "dc1", 1, "party 'dc1' is already registered: its worker of rank 1 still runs (is the party "
                            "started twice?"),
    (Role.LOCAL_SERVER, "dc0", 0, "party 'dc0' is already registered: its local_server still runs"),
])
def test_a_party_started_twice_is_refused_once_its_first_self_sends_a_heartbeat(scheduler, role, party, rank, words):
    register(scheduler, "twin", role, party, rank)
    old = {"dc1": "dc1-rank1", "dc0": "dc0-server"}[party]
    with scheduler._lock:
        scheduler._admit_waiting()
    assert not scheduler.refused  # its first self may have just died: it waits
    registered_long_ago(scheduler)
    heartbeat(scheduler, old)  # ... but that one still runs
    with scheduler._lock:
        scheduler._admit_waiting()
    assert [sender for sender, _ in scheduler.refused] == ["twin"] and not scheduler.rejoined
    assert scheduler.refused[0][1].startswith(words), scheduler.refused


def test_a_restarted_rank_whose_old_self_is_silent_waits_and_rejoins(scheduler):
    heartbeat(scheduler, "dc1-rank1")  # its last heartbeat, before it died
    register(scheduler, "restarted", Role.WORKER, "dc1", 1)
    registered_long_ago(scheduler)
    scheduler._heard["dc1-rank1"] = scheduler._waiting[0][0] - 1.0  # (heard before it registered)
    with scheduler._lock:
        scheduler._admit_waiting()
    assert not scheduler.refused and not scheduler.rejoined
    scheduler._watch.declare("dc1-rank1", "no heartbeat")
    with scheduler._lock:
        scheduler._admit_waiting()
    assert scheduler.rejoined == [("restarted", "dc1-rank1")] and not scheduler.refused


def test_a_party_started_twice_while_the_job_registers_is_named_as_registered_already(monkeypatch):
    topology = Topology(parties=(PartySpec("dc0", 1), PartySpec("dc1", 1)), central="dc0")
    sched = Scheduler(NodeConfig(role=Role.GLOBAL_SCHEDULER, party="dc0", topology=topology, global_scheduler=ADDRESS))
    refused: list[str] = []
    monkeypatch.setattr(sched, "_refuse", lambda *args: refused.append(args[-1]))
    try:
        register(sched, "dc1-server", Role.LOCAL_SERVER, "dc1", 0)
        register(sched, "twin", Role.LOCAL_SERVER, "dc1", 0)
    finally:
        sched.van.stop()
    assert len(refused) == 1 and refused[0].startswith("party 'dc1' is already registered (is it started twice?)")
