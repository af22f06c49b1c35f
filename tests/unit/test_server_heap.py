"""A server process keeps the memory it frees (``geomx.server.heap``): a round's large arrays reuse the last
round's pages instead of faulting in fresh ones, on a thread as on the main thread; ``python -m geomx.node`` asks
for it in every server before the server starts."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from geomx import node
from geomx.config import Role

ROUNDS = textwrap.dedent("""
    import json, resource, sys, threading
    import numpy as np
    from geomx.server.heap import keep_freed_memory

    took = keep_freed_memory() if sys.argv[1] == "keep" else None
    pushed = np.ones(10_000_000, np.int8)  # a 40 MB float32 slice each round, decoded and scaled as int8's decode
    faults = []

    def rounds():
        for _ in range(3):
            decoded = pushed.astype(np.float32); scaled = decoded * 2; del decoded, scaled
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(8):
            decoded = pushed.astype(np.float32); scaled = decoded * 2; del decoded, scaled
        faults.append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 8)

    thread = threading.Thread(target=rounds)  # a server's rounds run on its dispatch thread
    thread.start(); thread.join()
    print(json.dumps({"took": took, "faults_per_round": faults[0]}))
""")


def _rounds(mode: str) -> dict[str, float]:
    done = subprocess.run([sys.executable, "-c", ROUNDS, mode], capture_output=True, text=True, timeout=120,
                          check=True)
    return json.loads(done.stdout)


def test_freed_arrays_are_reused_not_faulted_in_again() -> None:
    kept = _rounds("keep")
    if not kept["took"]:
        pytest.skip("the C library has no mallopt (not glibc): keep_freed_memory does nothing here")
    usual = _rounds("usual")
    # glibc's usual: each 40 MB array is mmapped fresh (thousands of faults a round, fewer with transparent huge
    # pages); kept: the heap's freed blocks serve the next round
    assert usual["faults_per_round"] > 40, usual
    assert kept["faults_per_round"] < usual["faults_per_round"] / 10, (kept, usual)


def test_a_server_node_keeps_freed_memory_before_it_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    import geomx.server
    import geomx.server.heap

    calls: list[str] = []
    monkeypatch.setattr(geomx.server.heap, "keep_freed_memory", lambda: calls.append("heap") or True)

    class Server:
        def __init__(self, config: object) -> None:
            calls.append("server")

        def run(self) -> int:
            return 0

    monkeypatch.setattr(geomx.server, "ParameterServer", Server)
    monkeypatch.setattr(node.gc, "freeze", lambda: None)  # not this test process's objects
    config = type("Config", (), {"role": Role.GLOBAL_SERVER})()
    assert node.run_node(config) == 0  # type: ignore[arg-type]
    assert calls == ["heap", "server"]
