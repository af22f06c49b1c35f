"""What a user sees of a resumed job, with real processes: a job crashes (its global server SIGKILLed after the
checkpoint of step 6: the killed server's counters are not final), a resume under other settings is refused, and
``geomx launch --resume`` goes on from step 6.

- the resumed workers' metrics records count the job's steps, from 6 to the last (before: from 0 again);
- each launch's summary is of that launch: the good resume's names no process of the crashed launch as "not
  final", and the refused one shows no worker's line (before: the crashed launch's last records);
- ``geomx report`` covers the whole job: its last step and both launches that trained.
"""

from __future__ import annotations

import time

from harness import run_job, write_topology

from geomx.launch import format_summary
from geomx.runs.report import build_report
from geomx.runs.runlog import read_metrics

STEPS = 12
OPTIONS = {"parties": {"dc0": 1, "dc1": 1}, "timeouts": {"request": "20s", "round": "20s", "shutdown": "5s"}}


def topology(path, folder, server_optimizer: str):
    write_topology(path, training={"server_optimizer": server_optimizer, "metrics_every": 2}, **OPTIONS)
    path.write_text(path.read_text() + f"checkpoint:\n  dir: {folder}\n  every_steps: 3\n  keep: 3\n")
    return path


def test_a_resumed_job_counts_on_and_each_launch_summarizes_itself(tmp_path):
    folder = tmp_path / "checkpoints"
    job = topology(tmp_path / "job.yaml", folder, "auto")
    crashed = run_job(tmp_path, "resume_train.py", "--steps", STEPS, "--kill-step", 8, "--wait-checkpoint", 6,
                      name="job", topology=job)
    assert crashed.result.exit_code != 0
    assert "global_server0" in crashed.summary["not_final"], crashed.tail()

    # other settings than the checkpoint's: the resume is refused, and nothing trains
    other = topology(tmp_path / "other.yaml", folder, "translate")
    refused = run_job(tmp_path, "resume_train.py", "--steps", STEPS, name="job", topology=other, resume=True)
    assert refused.result.exit_code != 0
    assert refused.summary["last_metrics"] == {}, format_summary(refused.result)
    assert "step=" not in format_summary(refused.result)

    started = time.time()
    resumed = run_job(tmp_path, "resume_train.py", "--steps", STEPS, name="job", topology=job, resume=True)
    resumed.assert_ok()
    assert {report["start_step"] for _, report in resumed.workers().values()} == {6}
    for name, records in read_metrics(resumed.run_dir, since=started).items():
        steps = [r["step"] for r in records]
        assert steps[0] == 6 and steps[-1] == STEPS and steps == sorted(steps), (name, steps)
    summary = resumed.summary
    assert summary["not_final"] == [], format_summary(resumed.result)
    assert {r["step"] for r in summary["last_metrics"].values()} == {STEPS}
    assert "counted until" not in format_summary(resumed.result)
    [row] = build_report([resumed.run_dir], tmp_path / "report")
    assert row["steps"] == STEPS and row["launches"] == 2, row
