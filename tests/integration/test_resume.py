"""Resume under the wrapper's plans, with real processes: a job crashes (its global server SIGKILLed after a few
checkpoints), ``geomx launch --resume`` goes on, and the resumed job must end where the single-process reference
ends after as many steps: Adam (an optimizer with state) on the mean gradient of every worker's batch.

- the default plan (FSA, the wrapped Adam stepping on every worker on the averaged gradient): the global servers
  hold gradient sums, the workers hold the model and Adam's moments (``geomx.torch.checkpoint``);
- ``server_optimizer: translate``: Adam runs on the global servers, whose checkpoints hold the model and the state;
- HFA with DiLoCo's outer Nesterov: the global servers hold the global model and the outer momentum, each worker
  its inner Adam's moments; the resumed job must end bit for bit where an uninterrupted one ends.

Before the fix, the default plan's resume handed the servers' gradient sums back as the model.
"""

from __future__ import annotations

import json

import jobkit
import pytest
import torch
from harness import run_job, write_topology

from geomx.core.strategy import WRAPPER_KEYS
from geomx.runs.checkpoint import SUMS, load_latest
from geomx.runs.runlog import read_stats
from geomx.torch.checkpoint import worker_dir

STEPS = 10
KILL = 8  # before step 8: the checkpoints of step 6 exist (every 3 steps)
LR = 0.01  # resume_train.py's


def reference(steps: int, num_workers: int) -> list[torch.Tensor]:
    """One process: the master's initial model, Adam on the mean loss over every worker's batch."""
    return jobkit.reference_after(steps, STEPS, num_workers, lambda params: torch.optim.Adam(params, lr=LR))


def assert_starts_from(snapshot, after_init: list[torch.Tensor]) -> None:
    """A resumed worker's model at start is, bit for bit, the global servers' checkpoint's (one slice a key)."""
    for index, got in enumerate(after_init):
        assert torch.equal(got.flatten(), torch.from_numpy(snapshot.values[(index, 0)]).flatten()), index


def with_checkpoints(path, folder, every_steps: int, **options):
    """A topology (harness.write_topology's ``options``) whose global servers and workers checkpoint to ``folder``."""
    write_topology(path, **options)
    path.write_text(path.read_text() + f"checkpoint:\n  dir: {folder}\n  every_steps: {every_steps}\n  keep: 3\n")
    return path


@pytest.mark.parametrize(("server_optimizer", "lan"), [("auto", "server"), ("translate", "server"),
                                                     ("auto", "collective")])
def test_a_crashed_job_resumes_where_it_stopped(tmp_path, server_optimizer, lan):
    """(``lan: collective``: dc1 is a torch.distributed group of 2 ranks, each syncing its share of the model.)"""
    folder = tmp_path / "checkpoints"
    parties = {"dc0": 1, "dc1": 1 if lan == "server" else 2}
    options = {"parties": parties, "training": {"server_optimizer": server_optimizer}, "lan": {"dc1": lan},
               "timeouts": {"request": "20s", "round": "20s", "shutdown": "5s"}}
    topology = with_checkpoints(tmp_path / "job.yaml", folder, 3, **options)

    # the global server writes its checkpoints in the background: the kill waits for the one of step 6 (a loaded
    # CI once killed it before any was on disk)
    crashed = run_job(tmp_path, "resume_train.py", "--steps", STEPS, "--kill-step", KILL, "--wait-checkpoint", 6,
                      name="crash", topology=topology)
    assert crashed.result.exit_code != 0
    snapshot = load_latest(folder, 0)
    assert snapshot is not None and snapshot.step >= 6, crashed.tail()
    assert snapshot.settings["server_optimizer"] == server_optimizer
    if server_optimizer == "auto":  # the servers hold sums; the workers hold the model, at their own steps
        assert snapshot.holds == SUMS
        for rank in range(sum(parties.values())):
            assert sorted(p.name for p in worker_dir(folder, rank).glob("*.json")) == \
                ["ckpt-000000003.json", "ckpt-000000006.json"]
        resumed_at = 6
    else:
        assert snapshot.holds == "model" and snapshot.optimizer_spec["name"] == "adam"
        resumed_at = snapshot.step

    resumed = run_job(tmp_path, "resume_train.py", "--steps", STEPS, name="resume", topology=topology, resume=True)
    resumed.assert_ok()
    want = reference(STEPS, sum(parties.values()))
    workers = resumed.workers()
    assert sorted(workers) == list(range(sum(parties.values())))
    for rank, (tensors, report) in workers.items():
        assert report["start_step"] == resumed_at, report
        for index, (got, expected) in enumerate(zip(tensors["final"], want, strict=True)):
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6,
                                       msg=lambda m, i=index, r=rank: f"worker {r} param {i}: {m}")


def test_hfa_with_an_outer_optimizer_resumes_bit_for_bit(tmp_path):
    """K1 = 2, K2 = 1: a global round every 2 steps, a checkpoint every 2 global rounds (4 steps); the crash comes
    before step 10, after the global servers' checkpoint of round 4 (step 8)."""
    options = {"parties": {"dc0": 1, "dc1": 1}, "hfa": {"k1": 2, "k2": 1},
               "training": {"server_optimizer": "outer_nesterov"},
               "timeouts": {"request": "20s", "round": "20s", "shutdown": "5s"}}
    steps = ["--steps", 12]
    straight = run_job(tmp_path, "resume_train.py", *steps, name="straight",
                       topology=with_checkpoints(tmp_path / "straight.yaml", tmp_path / "straight", 2, **options))
    straight.assert_ok()
    folder = tmp_path / "checkpoints"
    topology = with_checkpoints(tmp_path / "job.yaml", folder, 2, **options)
    crashed = run_job(tmp_path, "resume_train.py", *steps, "--kill-step", 10, "--wait-checkpoint", 4, name="crash",
                      topology=topology)
    assert crashed.result.exit_code != 0
    snapshot = load_latest(folder, 0)
    assert snapshot is not None and snapshot.step == 4 and snapshot.holds == "model", crashed.tail()
    assert snapshot.optimizer_spec["name"] == "outer_nesterov" and snapshot.optimizer_state
    for rank in (0, 1):  # the inner Adam's state, at the steps of the global servers' checkpoints (dc1's worker
        names = {p.name for p in worker_dir(folder, rank).glob("*.json")}  # may have gone on to step 12)
        assert {"ckpt-000000004.json", "ckpt-000000008.json"} <= names, names

    resumed = run_job(tmp_path, "resume_train.py", *steps, name="resume", topology=topology, resume=True)
    resumed.assert_ok()
    want = straight.workers()
    for rank, (tensors, report) in resumed.workers().items():
        assert report["start_step"] == 8, report
        for index, (got, expected) in enumerate(zip(tensors["final"], want[rank][0]["final"], strict=True)):
            assert torch.equal(got, expected), f"worker {rank} param {index}: {(got - expected).abs().max()}"


@pytest.mark.parametrize("quorum", [2, 1], ids=["quorum_every_party", "quorum_1_of_2"])
def test_decoupled_rounds_resume(tmp_path, quorum):
    """Decoupled rounds (HFA K1 = 2, K2 = 1, outer Nesterov, checkpoints every 2 global rounds), crashed and
    resumed: the rounds go on from the checkpoint's count with every party's first delta on time (none folded in
    late or dropped), and the parties' tokens count from the resumed round.

    - quorum = every party: crashed after the checkpoint of round 4; the resumed job ends bit for bit where an
      uninterrupted decoupled one ends;
    - quorum 1 of 2, grace 5 s: dc0's worker stops before its step 10 (its checkpoints of steps 4 and 8) until dc1
      has finished (step 12, its last) and the rounds have gone on to 6 or beyond, then crashes the job. The
      global servers' checkpoint is of round 6 or later, a step dc0 never reached: its worker resumes from its
      newest checkpoint before it (step 8, with the global model of that round), dc1's at 12. Before, dc0's
      worker was refused (no checkpoint of step 12)."""
    # quorum 1: a grace of 5 s lets both parties join rounds 1-4 however loaded the machine (with grace 0 a party
    # ahead closed rounds alone, the other's pushes came late or were dropped, and the rounds the two made, so the
    # servers' checkpoint and dc1's resume step, depended on timing: CI read 8 rounds once, under load 5)
    decoupled = {"quorum": quorum, "grace": "auto" if quorum == 2 else "5s"}
    options = {"parties": {"dc0": 1, "dc1": 1}, "hfa": {"k1": 2, "k2": 1},
               "training": {"server_optimizer": "outer_nesterov", **decoupled},
               "timeouts": {"request": "20s", "round": "20s", "shutdown": "5s"}}
    steps = ["--steps", 12]
    rounds = 4 if quorum == 2 else 6  # the global servers' checkpoint the job resumes from
    folder = tmp_path / "checkpoints"
    topology = with_checkpoints(tmp_path / "job.yaml", folder, 2, **options)
    finished = [] if quorum == 2 else ["--wait-worker", "1:12"]  # dc1 has finished before the crash
    crashed = run_job(tmp_path, "resume_train.py", *steps, "--kill-step", 10, "--wait-checkpoint", rounds,
                      *finished, name="crash", topology=topology)
    assert crashed.result.exit_code != 0
    snapshot = load_latest(folder, 0)
    assert snapshot is not None and snapshot.holds == "model", crashed.tail()
    # quorum 1: dc0's 4 rounds and dc1's 6 make 6 global rounds where they join for the first 4 (the grace's
    # doing), more where one still ran ahead: the resume is the same either way
    assert snapshot.step == rounds if quorum == 2 else snapshot.step >= rounds, crashed.tail()
    assert "ckpt-000000012.json" not in {p.name for p in worker_dir(folder, 0).glob("*.json")}

    resumed = run_job(tmp_path, "resume_train.py", *steps, name="resume", topology=topology, resume=True)
    resumed.assert_ok()
    workers = resumed.workers()
    assert {rank: report["start_step"] for rank, (_, report) in workers.items()} == \
        ({0: 8, 1: 8} if quorum == 2 else {0: 8, 1: 12})
    [report] = [s["outer_rounds"] for s in read_stats(resumed.run_dir) if "outer_rounds" in s]
    assert report["rounds"] > 0 and report["dropped"] == {} and report["late_folded"] == {}, report
    assert all(entry["round"] >= snapshot.step for entry in report["last_rounds"]), report["last_rounds"]
    assert "dc0/server" not in report["missed"], report  # (dc1, with no step left, misses the last rounds)
    if quorum < 2:
        return
    straight = run_job(tmp_path, "resume_train.py", *steps, name="straight",
                       topology=with_checkpoints(tmp_path / "straight.yaml", tmp_path / "straight", 2, **options))
    want = straight.workers()
    for rank, (tensors, _) in workers.items():
        for index, (got, expected) in enumerate(zip(tensors["final"], want[rank][0]["final"], strict=True)):
            assert torch.equal(got, expected), f"worker {rank} param {index}: {(got - expected).abs().max()}"


def test_streaming_hfa_resumes_at_the_last_cycle_from_the_global_model(tmp_path):
    """Streaming (2 fragments, each a round of K2 = 2 local rounds of K1 = 2 steps, overlapped by one local round):
    a global server's checkpoint is of a step every fragment has reached (the end of a cycle, 4 steps), never of
    a fragment already a cycle further; the resumed job starts there, every worker from the checkpoint's global
    model with its inner Adam's state of that step. What is not kept is fragment 0's party-local progress since
    its global round of that cycle (it restarts at the global model): a run resumed so ends near an uninterrupted
    one (0.018 apart here, on weights of 0.2), not at it. Before, the resumed loop started at step 0 with a fresh
    inner optimizer."""
    options = {"parties": {"dc0": 1, "dc1": 1}, "hfa": {"k1": 2, "k2": 2},
               "training": {"server_optimizer": "outer_nesterov", "fragments": 2, "fragment_delay": 1},
               "timeouts": {"request": "20s", "round": "20s", "shutdown": "5s"}}
    folder = tmp_path / "checkpoints"
    topology = with_checkpoints(tmp_path / "job.yaml", folder, 1, **options)
    crashed = run_job(tmp_path, "resume_train.py", "--steps", 12, "--kill-step", 10, "--wait-checkpoint", 2,
                      name="crash", topology=topology)
    assert crashed.result.exit_code != 0
    snapshot = load_latest(folder, 0)
    assert snapshot is not None and snapshot.step == 2 and snapshot.holds == "model", crashed.tail()
    counts = {sid: count for sid, count in snapshot.rounds.items() if sid[0] < WRAPPER_KEYS}
    assert set(counts.values()) == {2}, counts  # every fragment's global round 2, none's 3
    for rank in (0, 1):
        assert "ckpt-000000008.json" in {p.name for p in worker_dir(folder, rank).glob("*.json")}

    resumed = run_job(tmp_path, "resume_train.py", "--steps", 12, name="resume", topology=topology, resume=True)
    resumed.assert_ok()
    for tensors, report in resumed.workers().values():
        assert report["start_step"] == report["adam_start"] == 8 and report["adam_steps"] == 12, report
        assert_starts_from(snapshot, tensors["after_init"])


def test_esync_resumes_each_worker_at_its_own_step(tmp_path):
    """ESync: each worker's steps per round are its own (assigned by speed), so the global servers' rounds tell no
    step; each worker checkpoints by global rounds, recording its own step, and a resumed worker starts from the
    checkpoint's global model at the step its checkpoint of those rounds records, with that step's inner Adam.
    Before, the resumed loop started at step 0 with a fresh inner optimizer (and a collective party's ranks took
    rounds x K1 for their step). dc0 is a party with a local server, dc1 a collective one of two ranks: both
    worker sides of ESync in one job."""
    parties = {"dc0": 1, "dc1": 2}
    options = {"parties": parties, "hfa": {"k1": 2, "k2": 1}, "lan": {"dc1": "collective"},
               "training": {"server_optimizer": "outer_nesterov", "esync": True},
               "timeouts": {"request": "20s", "round": "20s", "shutdown": "5s"}}
    folder = tmp_path / "checkpoints"
    topology = with_checkpoints(tmp_path / "job.yaml", folder, 1, **options)
    # 40 steps, killed at 12: ESync gives a faster party more steps a round, and a party that ends its loop before
    # the kill leaves, so the global servers' newest checkpoint would be of rounds it never made (at load 8 dc1 was
    # once 1.4x faster than dc0 and ended 16 steps before dc0 reached 12)
    crashed = run_job(tmp_path, "resume_train.py", "--steps", 40, "--kill-step", 12, "--wait-checkpoint", 2,
                      name="crash", topology=topology)
    assert crashed.result.exit_code != 0
    snapshot = load_latest(folder, 0)
    assert snapshot is not None and snapshot.step >= 2 and snapshot.holds == "model", crashed.tail()
    loop_steps = {}  # each worker's step at the checkpoint's rounds, as its own checkpoint records it
    for rank in range(sum(parties.values())):
        manifest = json.loads((worker_dir(folder, rank) / f"ckpt-{snapshot.step:09d}.json").read_text())
        loop_steps[rank] = manifest["loop_step"]
        assert manifest["loop_step"] >= 2 * snapshot.step, manifest  # each round at least K1 steps

    resumed = run_job(tmp_path, "resume_train.py", "--steps", 40, name="resume", topology=topology, resume=True)
    resumed.assert_ok()
    for rank, (tensors, report) in resumed.workers().items():
        assert report["start_step"] == report["adam_start"] == loop_steps[rank], (rank, report)
        assert_starts_from(snapshot, tensors["after_init"])
