"""What a watched connection says (transport/reach.py), and whether a port listens (cluster/addresses.py)."""

from __future__ import annotations

import socket

import pytest
import zmq

from geomx.cluster.addresses import claim, listening
from geomx.config import ConfigError
from geomx.transport.reach import Reach


def test_a_connection_refused_says_nothing_listens():
    reach = Reach("tcp://127.0.0.1:9", "none")
    assert reach.describe().startswith("no connection yet")
    for _ in range(3):
        reach.note(zmq.EVENT_CONNECT_RETRIED, 100)
    assert reach.describe() == "nothing listens there (connection refused, 3 tries)" and reach.refusal is None


@pytest.mark.parametrize(("mechanism", "event", "words"), [
    ("plain", zmq.EVENT_HANDSHAKE_FAILED_AUTH, "refused this node's shared secret"),
    ("curve", zmq.EVENT_HANDSHAKE_FAILED_AUTH, "refused this node's CURVE key"),
    ("plain", zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, "does not speak this node's security (PLAIN)"),
])
def test_a_refusal_is_named_by_what_was_refused(mechanism, event, words):
    reach = Reach("tcp://127.0.0.1:9", mechanism)
    reach.note(zmq.EVENT_CONNECTED, 0)
    reach.note(event, 400)
    assert reach.refusal is not None and reach.refusal.startswith(words) and reach.describe() == reach.refusal


def test_a_handshake_that_passed_is_a_running_peer():
    reach = Reach("tcp://127.0.0.1:9", "plain")
    reach.note(zmq.EVENT_CONNECTED, 0)
    reach.note(zmq.EVENT_HANDSHAKE_SUCCEEDED, 0)
    assert reach.handshaken and reach.refusal is None and reach.describe().startswith("it runs")


def test_listening_reads_the_kernel_and_claim_refuses_a_listened_port():
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        assert listening(port) is True
        with pytest.raises(ConfigError, match=rf"the tier cannot listen at 127.0.0.1:{port}: Address already in use"):
            claim(f"127.0.0.1:{port}", "the tier")
    held = claim(f"127.0.0.1:{port}", "the tier")  # free again; held, never listening
    try:
        assert listening(port) is False
    finally:
        held.close()
