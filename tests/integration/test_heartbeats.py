"""Failure detection with real processes: a node that goes silent (SIGSTOP: alive, but it says nothing, so
the launcher cannot notice) is declared dead by its scheduler within the heartbeat timeout, every process
that waits for it names it, and FSA stops with that message, long before any round or request timeout.
"""

from __future__ import annotations

import json
import re
import threading

import jobkit
import pytest
import torch
import torch.nn.functional as F
from harness import run_job, write_topology

from geomx.launch import format_summary

# cold: a worker SIGSTOPs its party's processes, found by their /proc environ (a warm worker's is its server's)
pytestmark = pytest.mark.cold_workers

HEARTBEAT_S = 3.0
LONG_S = 90.0  # round and request timeouts: the job must stop long before these could fire
TIMEOUTS = {"heartbeat": f"{HEARTBEAT_S:g}s", "heartbeat_interval": "0.25s", "round": f"{LONG_S:g}s",
            "request": f"{LONG_S:g}s", "shutdown": "5s"}


def lines_naming(output: str, dead: str) -> dict[str, list[str]]:
    """Process label -> its log lines that say ``dead`` is dead."""
    found: dict[str, list[str]] = {}
    for line in output.splitlines():
        match = re.match(r"\[([^\]]+)\] (.*)", line)
        if match and f"{dead} is dead" in match.group(2):
            found.setdefault(match.group(1), []).append(match.group(2))
    return found


def fault_time(job) -> float:
    return json.loads((job.run_dir / jobkit.OUT_DIR / "fault.json").read_text())["time"]


def test_silent_worker_is_declared_dead_and_fsa_stops_naming_it(geomx_job):
    """dc1/worker1 stops itself at step 2. Its scheduler declares it dead, its local server fails the round
    naming it and stops, dc1/worker0 gets that error and exits: the job ends, with a clear message."""
    job = geomx_job("survive_train.py", "--steps", "6", "--fault-step", "2", "--fault-rank", "3",
                    "--freeze", "self", timeouts=TIMEOUTS)
    assert job.result.exit_code != 0
    named = lines_naming(job.output, "dc1/worker1")
    for process in ("dc1/scheduler", "dc1/server"):
        assert process in named, (process, sorted(named), job.tail())
    assert any("sent no heartbeat" in line or "no heartbeat for" in line for line in named["dc1/scheduler"])
    assert any("cannot go on without it" in line for line in named["dc1/server"]), named["dc1/server"]
    error = json.loads((job.run_dir / jobkit.OUT_DIR / "error2.json").read_text())["error"]
    assert "dc1/worker1 is dead" in error and "dc1/server" in error, error  # dc1/worker0's failure says why
    assert job.returned_at - fault_time(job) < HEARTBEAT_S + 20, "detection took too long"
    assert job.result.wall_s < LONG_S


def test_silent_global_server_is_named_by_every_party(geomx_job):
    """dc0/worker0 stops the global server at step 2. The global scheduler declares it dead; both local
    servers learn it from their heartbeats, fail their rounds naming it, and the workers fail with it."""
    job = geomx_job("survive_train.py", "--steps", "6", "--fault-step", "2", "--fault-rank", "0",
                    "--freeze", "global_server", parties={"dc0": 1, "dc1": 1}, timeouts=TIMEOUTS)
    assert job.result.exit_code != 0
    named = lines_naming(job.output, "global_server0")
    for process in ("global_scheduler", "dc0/server", "dc1/server"):
        assert process in named, (process, sorted(named), job.tail())
    errors = [json.loads(p.read_text())["error"] for p in (job.run_dir / jobkit.OUT_DIR).glob("error*.json")]
    assert errors and all("global_server0 is dead" in e for e in errors), errors
    assert job.returned_at - fault_time(job) < HEARTBEAT_S + 20, "detection took too long"
    assert job.result.wall_s < LONG_S


def test_mixed_sync_drops_a_silent_party_and_the_other_goes_on(geomx_job):
    """Under MixedSync every process of dc1 stops at its step 3 (the whole data center goes dark). The
    global scheduler declares dc1/server dead, the global server drops it from the global rounds, and dc0
    keeps training to its last step and leaves normally. The job still exits non-zero: the global
    scheduler reports the member it lost (and the launcher then stops the frozen processes), and the summary
    names that member."""
    steps = 50
    job = geomx_job("survive_train.py", "--kind", "dist_async", "--steps", str(steps), "--fault-step", "3",
                    "--fault-rank", "1", "--freeze", "party", "--step-seconds", "0.1",
                    parties={"dc0": 1, "dc1": 1}, timeouts=TIMEOUTS)
    assert job.workers().keys() == {0}, "dc0's worker did not finish its training"
    named = lines_naming(job.output, "dc1/server")
    assert "global_scheduler" in named and "global_server0" in named, (sorted(named), job.tail())
    lines = job.output.splitlines()
    dropped = next(i for i, line in enumerate(lines) if "dropped dc1/server from the rounds" in line)
    left = next(i for i, line in enumerate(lines) if "[global_server0]" in line and "dc0/server left" in line)
    assert dropped < left, "dc0 should still have been training when dc1 was dropped"
    assert "members lost: dc1/server" in job.output, job.tail()
    # the summary names the member lost, not the scheduler that exited with code 4 for it (which it used to)
    assert job.result.failed == "dc1/server", job.tail()
    summary = format_summary(job.result)
    assert "status        : FAILED (dc1/server was lost: no heartbeat for" in summary, summary
    assert job.result.wall_s < LONG_S


def reference_with_a_dropped_worker(steps: int, drop_at: int) -> list:
    """Single-process SGD (momentum) on both workers' batches until ``drop_at``, then on worker 0's only."""
    torch.manual_seed(jobkit.seed_for(0))
    model = jobkit.make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=jobkit.LR, momentum=jobkit.MOMENTUM)
    inputs, targets = jobkit.make_data(steps, 2)
    for step in range(steps):
        ranks = slice(0, 2) if step < drop_at else slice(0, 1)
        optimizer.zero_grad()
        F.mse_loss(model(inputs[step, ranks].reshape(-1, jobkit.IN_FEATURES)),
                   targets[step, ranks].reshape(-1, jobkit.OUT_FEATURES)).backward()
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


def test_elastic_fsa_drops_a_silent_party_and_rescales_to_the_workers_present(geomx_job, tmp_path):
    """``elastic: true``: dc1 goes dark before pushing step 3. The global server waits for it in round 3
    until it is declared dead, then drops it and completes the round with dc0 alone, the sum rescaled so
    the optimizer averages over the workers present. dc0's model equals a single-process run that used
    both batches for steps 0-2 and dc0's batch from step 3 on: exactly the contributions that were applied."""
    steps, drop_at = 8, 3
    topology = write_topology(tmp_path / "elastic.yaml", parties={"dc0": 1, "dc1": 1}, timeouts=TIMEOUTS)
    topology.write_text(topology.read_text() + "elastic: true\n")
    job = geomx_job("survive_train.py", "--steps", str(steps), "--fault-step", str(drop_at), "--fault-rank", "1",
                    "--freeze", "party", topology=topology)
    workers = job.workers()
    assert workers.keys() == {0}, job.tail()
    assert "dropped dc1/server from the rounds" in job.output
    reference = reference_with_a_dropped_worker(steps, drop_at)
    for index, (got, want) in enumerate(zip(workers[0][0]["final"], reference, strict=True)):
        torch.testing.assert_close(got, want, msg=lambda m, i=index: f"parameter {i}: {m}")
    assert job.result.wall_s < LONG_S


def test_elastic_fsa_with_tsengine_inside_the_party_drops_a_silent_worker(geomx_job, tmp_path):
    """``elastic: true`` and ENABLE_INTRA_TS, one party of 2 workers: worker 1 goes silent before pushing step 3.
    The local server (the workers' TSEngine coordinator) drops it, forgets it in its overlays and completes
    the round with worker 0's push alone, rescaled: worker 0's model equals the same single-process run."""
    steps, drop_at = 8, 3
    topology = write_topology(tmp_path / "elastic-ts.yaml", parties={"dc0": 2}, timeouts=TIMEOUTS)
    topology.write_text(topology.read_text() + "elastic: true\ntsengine: {inter: false, intra: true}\n")
    job = geomx_job("survive_train.py", "--steps", str(steps), "--fault-step", str(drop_at), "--fault-rank", "1",
                    "--freeze", "self", topology=topology)
    workers = job.workers()
    assert workers.keys() == {0}, job.tail()
    assert "dropped dc0/worker1 from the rounds" in job.output, job.tail()
    reference = reference_with_a_dropped_worker(steps, drop_at)
    for index, (got, want) in enumerate(zip(workers[0][0]["final"], reference, strict=True)):
        torch.testing.assert_close(got, want, msg=lambda m, i=index: f"parameter {i}: {m}")
    assert job.result.wall_s < LONG_S


def test_a_party_lost_across_hosts_is_named_by_the_central_party(tmp_path, reserved_port):
    """Per-party launches (as on two hosts): dc1's worker dies, so dc1's launcher stops all of dc1 and
    nothing tells dc0. Only the heartbeats do: the global scheduler declares dc1/server dead, and dc0 stops
    naming it within seconds, not after the 90 s round timeout."""
    topology = write_topology(tmp_path / "split.yaml", timeouts=TIMEOUTS)
    global_scheduler = f"127.0.0.1:{reserved_port()}"
    jobs: dict = {}

    def launch_party(party: str) -> None:
        jobs[party] = run_job(tmp_path, "train.py", "--die-rank", "3", "--fault-step", "2", "--steps", "6",
                              name="split", party=party, global_scheduler=global_scheduler, topology=topology)

    threads = [threading.Thread(target=launch_party, args=(party,)) for party in ("dc1", "dc0")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=LONG_S + 60)
    assert set(jobs) == {"dc0", "dc1"}, "a launcher did not return"
    dc0, dc1 = jobs["dc0"], jobs["dc1"]
    assert dc1.result.failed == "dc1/worker1"
    assert dc0.result.exit_code != 0
    named = lines_naming(dc0.output, "dc1/server")
    assert "global_scheduler" in named and "global_server0" in named, (sorted(named), dc0.tail())
    died_at = json.loads((dc1.run_dir / jobkit.OUT_DIR / "death.json").read_text())["time"]
    assert dc0.returned_at - died_at < HEARTBEAT_S + 30, "dc0 took too long to notice"
    assert dc0.result.wall_s < LONG_S
