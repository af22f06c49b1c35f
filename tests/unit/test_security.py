"""Authentication and encryption of the van: real Van objects over 127.0.0.1 with a shared secret (PLAIN)
or CURVE keys from ``generate_keys``. A peer without the credentials is refused during the ZeroMQ
handshake: its frames never reach the decoder, the handler or the byte counters."""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import zmq

from geomx.config import ConfigError, PartySpec, SecuritySpec, Topology
from geomx.protocol.wire import Kind, Message, encode
from geomx.transport.security import Guard, SecurityError, generate_keys
from geomx.transport.van import Van

WAIT = 10.0
SECRET = "correct horse battery staple"


def topology(security: SecuritySpec) -> Topology:
    return Topology(parties=(PartySpec("a", 1), PartySpec("b", 1)), central="a", security=security)


@pytest.fixture
def vans() -> Iterator[Callable[..., tuple[Van, queue.Queue[Message]]]]:
    started: list[Van] = []

    def make(identity: str, party: str, security: SecuritySpec) -> tuple[Van, queue.Queue[Message]]:
        inbox: queue.Queue[Message] = queue.Queue()
        van = Van(identity, party=party, topology=topology(security), handler=inbox.put)
        started.append(van)
        van.start()
        return van, inbox

    yield make
    for van in started:
        van.stop(flush_timeout=0.5)


def wait_until(condition: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)


def send(sender: Van, receiver: Van, party: str, message: Message) -> None:
    sender.add_peer(receiver.identity, receiver.address, party)
    sender.send(receiver.identity, message)


def assert_refused_then_legit_only(server: Van, inbox: queue.Queue[Message], legit: Van) -> None:
    server.add_peer(legit.identity, legit.address, legit.party)  # so its bytes count under its name
    unknown_before = server.counters.snapshot()["peers"].get("<unknown>")
    wait_until(lambda: server.guard.refused >= 1, "the stranger to be refused")
    send(legit, server, "a", Message(Kind.PULL, key=7))
    message = inbox.get(timeout=WAIT)
    assert message.key == 7 and message.sender == legit.identity.encode()
    assert inbox.empty()
    # the stranger's bytes were not even counted: they never left ZeroMQ's handshake
    assert server.counters.snapshot()["peers"].get("<unknown>") == unknown_before
    assert server.malformed == 0


def test_shared_secret_admits_peers_that_know_it_and_refuses_the_rest(vans, caplog):
    spec = SecuritySpec(secret=SECRET)
    server, inbox = vans("server", "a", spec)
    client, _ = vans("client", "a", spec)
    send(client, server, "a", Message(Kind.PULL, key=1, tensor=np.arange(4, dtype=np.float32)))
    got = inbox.get(timeout=WAIT)
    assert got.key == 1 and got.tensor is not None and got.tensor.tolist() == [0, 1, 2, 3]
    stranger, _ = vans("stranger", "a", SecuritySpec(secret="not the secret at all"))
    send(stranger, server, "a", Message(Kind.PULL, key=666))
    assert_refused_then_legit_only(server, inbox, client)
    assert any("refused a connection from 127.0.0.1: wrong shared secret" in r.getMessage()
               for r in caplog.records)


def test_a_peer_without_any_credentials_is_refused(vans):
    server, inbox = vans("server", "a", SecuritySpec(secret=SECRET))
    client, _ = vans("client", "a", SecuritySpec(secret=SECRET))
    context = zmq.Context()
    raw = context.socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(server.address)
    raw.send_multipart(encode(Message(Kind.PULL, key=666)), copy=False)
    try:
        assert_refused_then_legit_only(server, inbox, client)
    finally:
        raw.close()
        context.term()


def test_curve_encrypts_and_admits_only_the_job_keys(vans, tmp_path: Path):
    keys = tmp_path / "keys"
    written = generate_keys(keys, ["a", "b"])
    assert sorted(p.name for p in written) == ["a.key", "a.key_secret", "b.key", "b.key_secret"]
    assert (keys / "a.key_secret").stat().st_mode & 0o077 == 0
    spec = SecuritySpec(curve_keys=keys)
    server, inbox = vans("server", "a", spec)
    client, _ = vans("client", "b", spec)
    send(client, server, "a", Message(Kind.PULL, key=3, tensor=np.ones(3, dtype=np.float64)))
    got = inbox.get(timeout=WAIT)
    assert got.key == 3 and got.sender == b"client"
    # a stranger with a key pair of its own (not in the job's folder) knows the server's public key
    other = tmp_path / "other"
    generate_keys(other, ["a"])
    for party in ("a", "b"):  # the job's public keys (a Guard reads every party's), its own secret
        (other / f"{party}.key").write_bytes((keys / f"{party}.key").read_bytes())
    stranger, _ = vans("stranger", "a", SecuritySpec(curve_keys=other))
    send(stranger, server, "a", Message(Kind.PULL, key=666))
    assert_refused_then_legit_only(server, inbox, client)


def test_plain_client_cannot_talk_to_a_curve_server(vans, tmp_path: Path):
    keys = tmp_path / "keys"
    generate_keys(keys, ["a", "b"])
    server, inbox = vans("server", "a", SecuritySpec(curve_keys=keys))
    client, _ = vans("client", "a", SecuritySpec(curve_keys=keys))
    stranger, _ = vans("stranger", "a", SecuritySpec(secret=SECRET))
    send(stranger, server, "a", Message(Kind.PULL, key=666))
    assert_refused_then_legit_only(server, inbox, client)


def test_guard_check_names_the_problem(tmp_path: Path):
    guard = Guard(SecuritySpec(secret=SECRET), "a")
    assert guard.check(b"PLAIN", [b"geomx", SECRET.encode()]) is None
    assert guard.check(b"PLAIN", [b"geomx", b"guess"]) == "wrong shared secret"
    assert guard.check(b"NULL", []) == "expected PLAIN, got NULL"
    assert Guard(SecuritySpec(), "a").mechanism == "none"


def test_bad_key_folders_are_refused_with_the_file_named(tmp_path: Path):
    with pytest.raises(SecurityError, match="does not exist"):
        Guard(SecuritySpec(curve_keys=tmp_path / "missing"), "a")
    generate_keys(tmp_path / "k", ["a"])
    with pytest.raises(SecurityError, match=r"party 'b' has no secret key .*b\.key_secret"):
        Guard(SecuritySpec(curve_keys=tmp_path / "k"), "b")
    with pytest.raises(SecurityError, match="already exist"):
        generate_keys(tmp_path / "k", ["a"])
    (tmp_path / "k" / "a.key_secret").write_text("garbage")
    with pytest.raises(SecurityError, match=r"a\.key_secret"):
        Guard(SecuritySpec(curve_keys=tmp_path / "k"), "a")


def test_short_secret_is_a_config_error():
    with pytest.raises(ConfigError, match="at least 8"):
        SecuritySpec(secret="short")
    assert SECRET not in repr(SecuritySpec(secret=SECRET))
