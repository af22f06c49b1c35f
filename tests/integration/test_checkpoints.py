"""Checkpoints, with real processes: kill -9 the global server mid-training, restart with ``--resume``.

Run A trains 8 FSA steps (SGD with momentum on the global server, a checkpoint every 2 steps) and a worker
kills the global server at step 5, once the checkpoint of step 4 is on disk. Every checkpoint on disk must
then equal the single-process reference after that many steps. The newest is corrupted on purpose; run B
(``--resume``) must refuse it, say why, start from the previous one (step 2, with the momentum buffers) and
end exactly where an uninterrupted run ends.
"""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import jobkit
import torch
from harness import Job, worker_command, write_topology

from geomx.core.strategy import WRAPPER_KEYS
from geomx.launch import launch
from geomx.runs.checkpoint import load, load_latest, shard_dir

STEPS = 8


def run(workdir: Path, name: str, topology: Path, *args: str, resume: bool = False) -> Job:
    """harness.run_job, plus ``resume`` (geomx launch --resume)."""
    run_dir = workdir / f"run-{name}"
    out = io.StringIO()
    result = launch(topology, worker_command("survive_train.py", *args), run_dir=run_dir, out=out, resume=resume)
    job = Job(result, out.getvalue(), run_dir, topology, time.time())
    print(f"===== job {name}: exit {result.exit_code} failed={result.failed} =====\n{job.output}")
    return job


def checkpoint_topology(tmp_path):
    path = write_topology(tmp_path / "ckpt.yaml", parties={"dc0": 1, "dc1": 1},
                          timeouts={"request": "20s", "round": "20s", "shutdown": "5s"})
    text = path.read_text() + "checkpoint:\n  dir: checkpoints\n  every_steps: 2\n  keep: 3\n"
    path.write_text(text)
    return path


def reference_after(steps: int, num_workers: int = 2) -> list[torch.Tensor]:
    """The single-process reference model after ``steps`` of the STEPS-step run's data (SGD with momentum)."""
    return jobkit.reference_after(steps, STEPS, num_workers,
                                  lambda params: torch.optim.SGD(params, lr=jobkit.LR, momentum=jobkit.MOMENTUM))


def assert_values_equal_reference(snapshot, steps: int) -> None:
    reference = reference_after(steps)
    assert sorted(sid for sid in snapshot.values if sid[0] < WRAPPER_KEYS) == [(i, 0) for i in range(len(reference))]
    for index, want in enumerate(reference):
        got = torch.from_numpy(snapshot.values[(index, 0)]).reshape(want.shape)
        torch.testing.assert_close(got, want, msg=lambda m, i=index: f"checkpoint step {steps}, param {i}: {m}")


def test_kill_global_server_then_resume_from_the_newest_valid_checkpoint(tmp_path):
    topology = checkpoint_topology(tmp_path)
    folder = tmp_path / "checkpoints"
    crashed = run(tmp_path, "crash", topology, "--steps", str(STEPS), "--fault-step", "5", "--fault-rank", "0",
                  "--kill", "global_server", "--wait-checkpoint", "4")
    assert crashed.result.exit_code != 0
    assert crashed.result.failed == "global_server0", crashed.tail()
    fault = json.loads((crashed.run_dir / jobkit.OUT_DIR / "fault.json").read_text())
    assert fault["checkpoint_step"] == 4

    # every checkpoint on disk is loadable and holds exactly the reference model of its step
    manifests = sorted(shard_dir(folder, 0).glob("ckpt-*.json"))
    assert [load(m).step for m in manifests] == [2, 4], manifests
    for manifest in manifests:
        snapshot = load(manifest)
        assert_values_equal_reference(snapshot, snapshot.step)
        assert snapshot.optimizer_spec is not None and snapshot.optimizer_spec["name"] == "sgd"
        assert snapshot.optimizer_state, "the momentum buffers were not saved"
    assert not list(shard_dir(folder, 0).glob(".*tmp")), "a temporary file was left behind"

    newest = shard_dir(folder, 0) / "ckpt-000000004.npz"
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0xFF
    newest.write_bytes(bytes(data))
    at_2 = load_latest(folder, 0)
    assert at_2 is not None and at_2.step == 2

    resumed = run(tmp_path, "resume", topology, "--steps", str(STEPS), "--resume-from-checkpoint", resume=True)
    resumed.assert_ok()
    assert "refused checkpoint" in resumed.output and "checksum mismatch" in resumed.output, resumed.tail()
    assert "resumed from" in resumed.output and "optimizer state restored from step 2" in resumed.output
    assert load_latest(folder, 0).step == STEPS  # the resumed run checkpoints on (and replaced the corrupt one)
    workers = resumed.workers()
    assert sorted(workers) == [0, 1]
    reference_final = reference_after(STEPS)
    torch.testing.assert_close(reference_final, jobkit.reference_run(2, STEPS)[1])
    for rank, (tensors, report) in workers.items():
        assert report["resumed_at"] == 2
        for index, got in enumerate(tensors["after_init"]):  # bit for bit: the checkpoint's model
            want = torch.from_numpy(at_2.values[(index, 0)]).reshape(got.shape)
            assert torch.equal(got, want), f"worker {rank} did not start from the checkpoint's model"
        for index, (got, want) in enumerate(zip(tensors["final"], reference_final, strict=True)):
            torch.testing.assert_close(got, want, msg=lambda m, i=index, r=rank: f"worker {r} param {i}: {m}")
