"""kill -9 at a random (seeded) step, for every target under every synchronization algorithm.

Each case is a real job of two per-party launches (as on two hosts: one launcher cannot stop the other's
processes, only heartbeats tell). A worker kills, with SIGKILL, one of: itself (a dc1 worker), dc1's local server,
or the global server (killed by dc0's worker). What must follow, and within the heartbeat timeout plus a margin,
never after a round or request timeout:

* dc1 lost under FSA: dc0 stops, naming dc1/server and saying the tier cannot go on without it.
* dc1 lost under MixedSync or HFA: dc0 trains to its last step; the global scheduler reports the lost member
  (exit 4). Under HFA dc0's last global model is the average of the contributions applied: its own model alone.
* the global server lost: every process of both parties stops, naming it (dc0) or the lost contact (dc1).

The cases run three at a time (they mostly wait for heartbeats), so the matrix costs about a minute.
"""

from __future__ import annotations

import random
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from harness import Job, run_job, write_topology

from geomx.launch import PortReservations

HEARTBEAT_S = 3.0
LONG_S = 90.0  # round and request timeouts: nothing may wait this long
TIMEOUTS = {"heartbeat": f"{HEARTBEAT_S:g}s", "heartbeat_interval": "0.25s", "round": f"{LONG_S:g}s",
            "request": f"{LONG_S:g}s", "shutdown": "10s"}
ALGORITHMS = ("fsa", "mixed", "hfa")
# Killing all of dc1 at once ("party", rejoin_train.py's default) is not a column here: under HFA and ESync it is
# test_rejoin.py's kill cases (the same worker script and per-party launches, asserting that dc0 drops dc1/server
# and trains on); under FSA and MixedSync what dc0 sees, dc1/server gone without a goodbye and only heartbeats to
# tell, is the "local_server" column's (dc1's launcher then stops the rest of dc1).
TARGETS = ("worker", "local_server", "global_server")
SEED = 7
STEPS = 40


@dataclass
class Case:
    algorithm: str
    target: str
    die_step: int
    jobs: dict[str, Job]
    killed_at: float  # time.time() when the fault was injected (from the killer's report)


def run_case(root: Path, algorithm: str, target: str, port: int) -> Case:
    die_step = random.Random(f"{SEED}-{algorithm}-{target}").randint(2, 12)
    folder = root / f"{algorithm}-{target}"
    topology = write_topology(folder / "job.yaml", parties={"dc0": 1, "dc1": 1}, timeouts=TIMEOUTS,
                              hfa={"k1": 2, "k2": 1} if algorithm == "hfa" else None)
    kind = ("--kind", "dist_async") if algorithm == "mixed" else ()
    killer = 0 if target == "global_server" else 1
    fault = ("--die-step", str(die_step), "--die-rank", str(killer), "--kill", target, "--fault-file",
             str(folder / "fault"))
    global_scheduler = f"127.0.0.1:{port}"
    jobs: dict[str, Job] = {}

    def launch(party: str) -> None:
        jobs[party] = run_job(folder, "rejoin_train.py", *kind, "--steps", str(STEPS), "--step-seconds", "0.05",
                              *fault, name="job", party=party, global_scheduler=global_scheduler,
                              topology=topology)

    threads = [threading.Thread(target=launch, args=(party,)) for party in ("dc0", "dc1")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=LONG_S + 60)
    assert set(jobs) == {"dc0", "dc1"}, f"{algorithm}/{target}: a launcher did not return"
    killed_at = float((folder / "fault").read_text())
    return Case(algorithm, target, die_step, jobs, killed_at)


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Case]:
    root = tmp_path_factory.mktemp("faults")
    with PortReservations("127.0.0.1") as ports, ThreadPoolExecutor(max_workers=3) as pool:
        futures = {(a, t): pool.submit(run_case, root, a, t, ports.take()) for a in ALGORITHMS for t in TARGETS}
        return {key: future.result() for key, future in futures.items()}


@pytest.mark.slow
@pytest.mark.timeout(420)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("target", TARGETS)
def test_kill_nine_at_a_random_step(matrix, algorithm, target):
    case = matrix[(algorithm, target)]
    dc0, dc1 = case.jobs["dc0"], case.jobs["dc1"]
    label = f"{algorithm}/{target} killed at step {case.die_step}"
    assert dc1.result.exit_code != 0, label
    for job in (dc0, dc1):  # nothing waited for a round or request timeout
        assert job.returned_at - case.killed_at < HEARTBEAT_S + 30, (label, job.tail())
        assert job.result.wall_s < LONG_S, label
    if target == "global_server":
        assert dc0.result.exit_code != 0 and not dc0.workers(), (label, dc0.tail())
        assert "global_server0 exited with code -9" in dc0.output, (label, dc0.tail())
        # dc1 names the lost contact: the global scheduler (dc0's launcher stopped it first) or, where the scheduler
        # declared the global server dead before it stopped, its upstream global server (dc1/server: "... is dead
        # (...); this party cannot train without it"; seen in 2 of 4 runs of the matrix on 2 cores)
        assert "global_scheduler has not answered heartbeats" in dc1.output or \
            "this party cannot train without it" in dc1.output, (label, dc1.tail())
        return
    assert "dc1/server is dead" in dc0.output, (label, dc0.tail())
    if algorithm == "fsa":
        assert dc0.result.exit_code != 0 and not dc0.workers(), (label, dc0.tail())
        assert "cannot go on without it" in dc0.output, (label, dc0.tail())
        return
    # MixedSync and HFA go on without dc1: dc0 trains to its last step, and the job says what it lost
    (tensors, report), = dc0.workers().values()
    assert report["steps"] == STEPS, (label, report)
    assert "dropped dc1/server from the rounds" in dc0.output, label
    assert dc0.result.failed == "global_scheduler" and "members lost: dc1/server" in dc0.output, (label, dc0.tail())
    if algorithm == "hfa":  # the last global model is the average of what was applied: dc0's model alone
        per = len(tensors["final"])
        for pushed, pulled in zip(tensors["pushed"][-per:], tensors["pulled"][-per:], strict=True):
            torch.testing.assert_close(pulled, pushed, rtol=1e-5, atol=1e-6)
        both = [i for i in range(0, per * case.die_step // 2, per)
                if not torch.allclose(tensors["pulled"][i], tensors["pushed"][i])]
        assert both, "before the fault the global model should have averaged both parties"

