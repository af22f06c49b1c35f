"""A CURVE node whose copy of its scheduler's public key is not the scheduler's (docs/deployment.md, "Bad starts":
another CURVE key than the central party's is named by the joining node at once). The scheduler cannot open such a
node's HELLO and closes the connection without a word; the node used to read that as "it was connected, then the
connection dropped; did it fail or was it stopped?" and wait out its registration timeout."""

from __future__ import annotations

import time

import zmq

from geomx.transport.reach import Reach, Watches

# what ZeroMQ's monitor reported for one such connection (libzmq 4.3, observed): connect delayed, connected, the
# handshake failed without detail (EPIPE), disconnected, reconnect scheduled
_ONE_DROPPED_HANDSHAKE = [(zmq.EVENT_CONNECT_DELAYED, 115), (zmq.EVENT_CONNECTED, 14),
                          (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, 32), (zmq.EVENT_DISCONNECTED, 14),
                          (zmq.EVENT_CONNECT_RETRIED, 125)]


def test_a_curve_handshake_dropped_again_and_again_is_named_as_a_key_mismatch():
    reach = Reach("tcp://127.0.0.1:9", "curve")
    for _ in range(3):
        for event, value in _ONE_DROPPED_HANDSHAKE:
            reach.note(event, value)
    assert reach.refusal is not None and reach.refusal.startswith("drops this node's CURVE handshake (3 tries)")
    assert "<party>.key" in reach.describe()


def test_one_dropped_handshake_is_not_yet_a_refusal_and_a_passing_one_clears_the_count():
    reach = Reach("tcp://127.0.0.1:9", "curve")
    for _ in range(2):
        for event, value in _ONE_DROPPED_HANDSHAKE:
            reach.note(event, value)
    reach.note(zmq.EVENT_CONNECTED, 14)
    reach.note(zmq.EVENT_HANDSHAKE_SUCCEEDED, 0)
    for event, value in _ONE_DROPPED_HANDSHAKE:
        reach.note(event, value)
    assert reach.refusal is None


def test_a_real_dealer_with_another_server_key_is_refused_within_seconds():
    ctx = zmq.Context()
    server_public, server_secret = zmq.curve_keypair()
    client_public, client_secret = zmq.curve_keypair()
    wrong_server_public, _ = zmq.curve_keypair()  # this host's copy of the scheduler's key: another key pair's
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    watches, poller = Watches("curve"), zmq.Poller()
    try:
        router.curve_server, router.curve_secretkey, router.curve_publickey = True, server_secret, server_public
        port = router.bind_to_random_port("tcp://127.0.0.1")
        dealer.curve_serverkey, dealer.curve_publickey = wrong_server_public, client_public
        dealer.curve_secretkey = client_secret
        watches.expect("global_scheduler", f"tcp://127.0.0.1:{port}")
        watches.attach("global_scheduler", dealer, poller)
        dealer.connect(f"tcp://127.0.0.1:{port}")
        reach = watches.reaches["global_scheduler"]
        deadline = time.monotonic() + 20
        while reach.refusal is None and time.monotonic() < deadline:
            watches.drain(dict(poller.poll(200)))
        assert reach.refusal is not None and "CURVE handshake" in reach.refusal
    finally:
        watches.close()
        router.close(linger=0)
        dealer.close(linger=0)
        ctx.term()
