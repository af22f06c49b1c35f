"""Heartbeats between real vans on 127.0.0.1 (a scheduler-side Watch answering, a node-side Pulse beating),
the Watch's bookkeeping, Requests failing at once for a dead peer, and the config knobs of issue 7."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from geomx.cluster.heartbeat import Watch, pulse_for
from geomx.config import (
    CheckpointSpec,
    ConfigError,
    PartySpec,
    SecuritySpec,
    Timeouts,
    Topology,
    load_topology,
    node_config_from_env,
)
from geomx.protocol.wire import Kind, Message
from geomx.transport.rpc import RemoteError, Requests
from geomx.transport.van import Van

FAST = Timeouts(heartbeat_s=0.5, heartbeat_interval_s=0.05)
# where the test waits for the scheduler's answers, not for a silence: a node gives its scheduler this long before
# it stops, so a first heartbeat slow to connect on a loaded machine does not end the test (0.5 s once did, in CI)
ANSWERED = Timeouts(heartbeat_s=10.0, heartbeat_interval_s=0.05)


def test_watch_declares_only_silent_members_that_did_not_leave() -> None:
    watch = Watch(FAST, {"a": "dc0/worker0", "b": "dc0/worker1", "c": "dc0/server"}, owner="dc0/scheduler")
    assert watch.check(gone=[]) == []
    deadline = time.monotonic() + 5
    found: list[tuple[str, str]] = []
    while not found and time.monotonic() < deadline:  # "a" keeps beating, "b" leaves, "c" goes silent
        watch.heard("a")
        found = watch.check(gone=["b"])
        time.sleep(0.02)
    assert [member for member, _ in found] == ["c"]
    assert "no heartbeat for" in found[0][1] and "declared by dc0/scheduler" in found[0][1]
    assert watch.check(gone=["b"]) == []  # declared once
    assert not watch.heard("stranger")
    watch.declare("stranger", "x")
    assert set(watch.snapshot()) == {"c"}


def test_pulse_learns_the_dead_from_the_scheduler_and_fails_requests_to_them() -> None:
    topology = Topology(parties=(PartySpec("a", 1),), central="a", timeouts=ANSWERED)
    dead_now = {"peer-x": "no heartbeat for 9 s"}
    beats = threading.Event()

    def scheduler_hook(message: Message) -> bool:
        beats.set()
        scheduler.send(message.sender.decode(), message.reply(body={"dead": dead_now}))
        return True

    scheduler = Van("sched", "a", topology, handler=lambda m: None)
    scheduler.heartbeat_hook = scheduler_hook
    node = Van("node", "a", topology, handler=lambda m: None)
    # a peer of its own that never answers: pointed at the scheduler's address, node's second connection there
    # (the same identity) raced its first, and whichever handshake lost was dropped by the scheduler's ROUTER
    silent = Van("peer-x", "a", topology, handler=lambda m: None)
    try:
        scheduler.start()
        node.start()
        silent.start()
        scheduler.add_peer("node", node.address, "a")
        node.add_peer("sched", scheduler.address, "a")
        node.add_peer("peer-x", silent.address, "a")
        requests = Requests(node, names={"peer-x": "dc9/server"})
        pending = requests.call("peer-x", Message(Kind.PULL))
        pulse = pulse_for(node, requests, ANSWERED)
        assert pulse_for(node, requests, ANSWERED) is pulse  # one per van
        told: list[tuple[str, str]] = []
        pulse.on_dead(lambda member, why: told.append((member, why)))
        pulse.watch("sched")
        assert beats.wait(5), "no heartbeat reached the scheduler"
        with pytest.raises(RemoteError, match="dc9/server is dead: no heartbeat for 9 s"):
            pending.result(timeout=5)
        assert told == [("peer-x", "no heartbeat for 9 s")]
        later = requests.call("peer-x", Message(Kind.PULL))  # fails at once, no timeout
        with pytest.raises(RemoteError, match="dc9/server is dead"):
            later.result(timeout=0.01)
    finally:
        node.stop(flush_timeout=0.5)
        scheduler.stop(flush_timeout=0.5)
        silent.stop(flush_timeout=0.5)


def test_a_node_declared_dead_itself_fails_every_request_and_tells_its_listeners() -> None:
    """Cut off longer than the heartbeat timeout, a node hears (once the WAN is back) that its scheduler declared
    it dead: every request, pending or later, fails naming that, and its server stops (the listener)."""
    topology = Topology(parties=(PartySpec("a", 1),), central="a", timeouts=ANSWERED)
    scheduler = Van("sched", "a", topology, handler=lambda m: None)
    scheduler.heartbeat_hook = lambda message: scheduler.send(
        message.sender.decode(), message.reply(body={"dead": {"node": "no heartbeat for 4.0 s"}})) is None
    node = Van("node", "a", topology, handler=lambda m: None, name="dc1/server")
    try:
        scheduler.start()
        node.start()
        scheduler.add_peer("node", node.address, "a")
        node.add_peer("sched", scheduler.address, "a")
        requests = Requests(node)
        pending = requests.call("sched", Message(Kind.PULL))  # the scheduler never answers it
        pulse = pulse_for(node, requests, ANSWERED)
        told: list[str] = []
        stopped = threading.Event()
        pulse.on_self_dead(lambda text: (told.append(text), stopped.set()))
        pulse.on_dead(lambda member, why: told.append(f"not me: {member}"))
        pulse.watch("sched")
        assert stopped.wait(5), "the node never learned it was declared dead"
        expected = r"dc1/server was declared dead \(no heartbeat for 4.0 s\) and dropped from the job; restart"
        with pytest.raises(RemoteError, match=expected):
            pending.result(timeout=5)
        with pytest.raises(RemoteError, match=expected):
            requests.call("sched", Message(Kind.PULL)).result(timeout=0.01)
        assert len(told) == 1 and "restart its party to rejoin" in told[0], told
    finally:
        node.stop(flush_timeout=0.5)
        scheduler.stop(flush_timeout=0.5)


def test_watch_adds_a_member_that_joins_later() -> None:
    watch = Watch(FAST, {"a": "dc1/server"}, owner="global_scheduler")
    assert not watch.heard("b")
    watch.add("b", "dc1/server")
    assert watch.heard("b") and watch.names["b"] == "dc1/server"


def test_heartbeat_timeouts_are_validated() -> None:
    with pytest.raises(ConfigError, match="heartbeat_interval"):
        Timeouts(heartbeat_s=1.0, heartbeat_interval_s=1.0)
    assert Timeouts().heartbeat_s <= 10.0


def test_topology_security_and_checkpoint_blocks(tmp_path: Path) -> None:
    (tmp_path / "secret.txt").write_text("a-long-enough-secret\n")
    path = tmp_path / "job.yaml"
    path.write_text("parties: {dc0: {workers: 1}}\n"
                    "security: {secret_file: secret.txt, curve_keys: keys}\n"
                    "checkpoint: {dir: ckpt, every_steps: 5, every_seconds: 2d, keep: 2}\n"
                    "timeouts: {heartbeat: 4s, heartbeat_interval: 500ms}\n")
    with pytest.raises(ConfigError, match="duration"):  # (days are not a unit; minutes are: 2m is 120 s)
        load_topology(path)
    path.write_text(path.read_text().replace("2d", "2m"))
    topology = load_topology(path)
    assert topology.security == SecuritySpec(secret="a-long-enough-secret", curve_keys=tmp_path / "keys")
    assert topology.checkpoint == CheckpointSpec(dir=tmp_path / "ckpt", every_steps=5, every_s=120.0, keep=2)
    assert topology.timeouts.heartbeat_s == 4.0 and topology.timeouts.heartbeat_interval_s == 0.5
    env = {"GEOMX_ROLE": "global_server", "GEOMX_PARTY": "dc0", "GEOMX_TOPOLOGY": str(path),
           "GEOMX_GLOBAL_SCHEDULER": "127.0.0.1:9", "GEOMX_SECRET": "from-the-environment",
           "GEOMX_CHECKPOINT_EVERY_STEPS": "7", "GEOMX_HEARTBEAT_TIMEOUT": "3s", "GEOMX_RESUME": "1"}
    node = node_config_from_env(env)
    assert node.resume
    assert node.topology.security.secret == "from-the-environment"
    assert node.topology.checkpoint.every_steps == 7 and node.topology.checkpoint.dir == tmp_path / "ckpt"
    assert node.topology.timeouts.heartbeat_s == 3.0


@pytest.mark.parametrize("block, message", [
    ("security: {secret: short}", "at least 8"),
    ("security: {secret: abcdefghij, secret_file: x}", "not both"),
    ("security: {password: abcdefghij}", "security"),
    ("checkpoint: {dir: ckpt}", "every_steps"),
    ("checkpoint: {dir: ckpt, every_steps: 1.5}", "integer"),
])
def test_bad_blocks_are_config_errors(tmp_path: Path, block: str, message: str) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(f"parties: {{dc0: {{workers: 1}}}}\n{block}\n")
    with pytest.raises(ConfigError, match=message):
        load_topology(path)
