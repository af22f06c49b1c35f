"""A van going away while its I/O thread sends ends that thread quietly; a fault while it runs still surfaces.

Before: Ctrl-C of a job printed "Exception in thread dc1/worker-io" with a traceback ending in pyzmq's
"zmq gc socket requested during shutdown" (the kvstore's exit hook flushed the van after pyzmq's own exit handler
had run), and a context terminated under a sending van raised ZMQError (ETERM) out of the thread; a stop then waited
its whole flush timeout for a thread that had died.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

import geomx.transport.van as van_module
from geomx.config import LinkSpec, PartySpec, Topology
from geomx.protocol.wire import Kind, Message
from geomx.transport.van import Van

WAIT_S = 20.0  # anything here happens within a second on localhost; generous for a loaded machine
SLOW_WAN = LinkSpec(bandwidth_bps=50e6)  # a 1 MB message takes 0.16 s: the queue below keeps the thread sending
TOPOLOGY = Topology(parties=(PartySpec("a", 1), PartySpec("b", 1)), central="a", wan=SLOW_WAN, lan=LinkSpec())


@pytest.fixture
def thread_errors(monkeypatch: pytest.MonkeyPatch) -> list[threading.ExceptHookArgs]:
    """What would have printed "Exception in thread ...": every exception a thread let out."""
    caught: list[threading.ExceptHookArgs] = []
    monkeypatch.setattr(threading, "excepthook", caught.append)
    return caught


@pytest.fixture
def vans() -> Iterator[tuple[Van, Van]]:
    """Two started vans in two parties, connected both ways; stopped at the end."""
    a = Van("a/w", party="a", topology=TOPOLOGY, handler=lambda m: None)
    received: list[Message] = []
    b = Van("b/s", party="b", topology=TOPOLOGY, handler=received.append)
    a.start()
    b.start()
    a.add_peer(b.identity, b.address, party="b")
    b.add_peer(a.identity, a.address, party="a")
    yield a, b
    for van in (a, b):
        van.stop(flush_timeout=1.0)


def keep_sending(van: Van, peer: str, messages: int = 40) -> None:
    """Queue ``messages`` of 1 MB each to ``peer``: the I/O thread sends them for seconds (the slow WAN)."""
    tensor = np.ones(1 << 18, dtype=np.float32)
    for _ in range(messages):
        van.send(peer, Message(Kind.PUSHPULL, tensor=tensor))
    assert not van.flush(0.3), "the queue should still be sending"


def test_a_van_whose_context_is_terminated_while_it_sends_ends_quietly(vans, thread_errors):
    a, b = vans
    keep_sending(a, b.identity)
    io, dispatch = a._threads
    terminating = threading.Thread(target=a._context.term, daemon=True)  # (returns once the I/O thread closed
    terminating.start()                                                  # its sockets)
    terminating.join(WAIT_S)
    io.join(WAIT_S)
    dispatch.join(WAIT_S)
    assert not terminating.is_alive() and not io.is_alive() and not dispatch.is_alive()
    assert thread_errors == [], [(e.thread.name if e.thread else "?", e.exc_value) for e in thread_errors]
    started = time.monotonic()
    a.stop(flush_timeout=WAIT_S)  # nothing more moves: the stop does not wait out its flush timeout
    assert time.monotonic() - started < WAIT_S / 2 and not a.running


def test_an_error_while_the_van_runs_still_surfaces(vans, thread_errors, monkeypatch):
    a, b = vans

    def broken(sock: object, frames: object) -> None:
        raise RuntimeError("zmq: a fault while running")  # (reads like pyzmq's, but the van is not stopping)

    monkeypatch.setattr(van_module, "send_frames", broken)
    a.send(b.identity, Message(Kind.PUSHPULL, tensor=np.ones(4, dtype=np.float32)))
    io = a._threads[0]
    io.join(WAIT_S)
    assert not io.is_alive()
    assert [(e.thread.name if e.thread else "?", str(e.exc_value)) for e in thread_errors] == [
        ("a/w-io", "zmq: a fault while running")]


EXIT_SCRIPT = """
    import atexit, threading
    import numpy as np
    from geomx.config import LinkSpec, PartySpec, Topology
    from geomx.protocol.wire import Kind, Message
    from geomx.transport.van import Van

    topology = Topology(parties=(PartySpec("a", 1), PartySpec("b", 1)), central="a",
                        wan=LinkSpec(bandwidth_bps=50e6), lan=LinkSpec())
    arrived = threading.Event()
    a = Van("a/w", party="a", topology=topology, handler=lambda m: None, name="dc1/worker")
    b = Van("b/s", party="b", topology=topology, handler=lambda m: arrived.set())
    a.start(); b.start()
    a.add_peer("b/s", b.address, party="b"); b.add_peer("a/w", a.address, party="a")
    atexit.register(lambda: a.stop(flush_timeout=30.0))  # as the kvstore's exit hook: after pyzmq's handler
    tensor = np.ones(1 << 18, dtype=np.float32)
    a.send("b/s", Message(Kind.PUSHPULL, tensor=tensor))  # the first zero-copy frame: pyzmq's handler registered
    assert arrived.wait(20.0), "no message arrived"
    for _ in range(40):  # seconds of sending left on the slow WAN when Ctrl-C comes
        a.send("b/s", Message(Kind.PUSHPULL, tensor=tensor))
    raise KeyboardInterrupt
"""


def test_ctrl_c_while_the_van_sends_prints_no_thread_traceback(tmp_path):
    script = tmp_path / "interrupted.py"
    script.write_text(textwrap.dedent(EXIT_SCRIPT))
    started = time.monotonic()
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert proc.stderr.rstrip().endswith("KeyboardInterrupt"), proc.stderr
    assert "Exception in thread" not in proc.stderr and "during shutdown" not in proc.stderr, proc.stderr
    assert "I/O thread has ended" not in proc.stderr, proc.stderr  # the dispatch thread ended quietly too
    assert time.monotonic() - started < 25.0  # the exit hook's stop did not wait out its 30 s flush
