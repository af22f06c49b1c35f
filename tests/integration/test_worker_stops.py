"""A worker that stops mid-run without raising: the job ends as promptly as for a crash and names it.

* A worker that exits while the others still train (``sys.exit(3)`` on NaN, or its script ending early on purpose):
  its exit hook says goodbye as at the end of training (Python keeps the exit code from the hook); its server sees a
  round that can never complete without it, refuses the goodbye and stops the tier, naming it. The summary names the
  worker and its exit code; nobody waits out the shutdown timeout, and no "Exception ignored in atexit" traceback.
* A clean exit at the end of training (no ``close``, one worker finishing later) is still the normal shutdown round.
* A worker that hangs in its own code: the first processes to exit are healthy workers whose waits ran out, but the
  summary names the hung one (the servers' round timeouts name whom they waited for: ``geomx.runs.findings``), and
  every healthy worker says why it stopped in one line, not a traceback.

Every job: 2 parties x 2 workers (HiPS), a plain kvstore loop (``workers/stops.py``) that never calls ``close``.
"""

from __future__ import annotations

import json
import re

import jobkit
from harness import Job

from geomx.launch import format_summary

SHUTDOWN_S = 30.0  # long: a job that waited it out would fail the "promptly" checks by far
HEALTHY = ("dc0/worker0", "dc1/worker0", "dc1/worker1")  # with dc0/worker1 (global rank 1) the faulty one


def stopped_at(job: Job) -> float:
    return float(json.loads((job.run_dir / jobkit.OUT_DIR / "stop.json").read_text())["time"])


def test_a_worker_that_exits_mid_run_is_named_with_its_code_at_once(geomx_job):
    """As for a crash: the launcher's first failure is the worker, with its code, and it stops the job at once."""
    job = geomx_job("stops.py", "--fault", "exit", "--code", "3", timeouts={"shutdown": f"{SHUTDOWN_S:g}s"})
    summary = format_summary(job.result)
    assert job.result.exit_code != 0 and job.result.failed == "dc0/worker1", summary
    assert "[geomx launch] dc0/worker1 exited with code 3; stopping the other processes" in job.output, job.tail()
    assert "FAILED (dc0/worker1 exited with code 3 before its push of round 3" in summary, summary
    assert "Exception ignored" not in job.output and "Traceback" not in job.output, job.tail()
    assert "to acknowledge shutdown" not in job.output  # nobody waited for a shutdown round that could not end
    assert job.returned_at - stopped_at(job) < SHUTDOWN_S / 2, "the job waited for the shutdown timeout"
    assert job.result.exit_codes["dc0/worker1"] == 3  # the hook kept the script's own exit code


def test_a_worker_whose_script_ends_early_with_code_0_fails_the_job_naming_it(geomx_job):
    """Code 0 is no failure to the launcher: the job stops once the heartbeats declare the leaver dead."""
    job = geomx_job("stops.py", "--fault", "exit", "--code", "0", "--rank", "2", "--step", "2",
                    timeouts={"shutdown": f"{SHUTDOWN_S:g}s", "heartbeat": "4s", "heartbeat_interval": "0.5s"})
    summary = format_summary(job.result)
    assert job.result.exit_code != 0 and job.result.failed == "dc1/worker0", summary
    assert "FAILED (dc1/worker0 exited with code 0 before its push of round 2" in summary, summary
    assert job.returned_at - stopped_at(job) < SHUTDOWN_S / 2, "the job waited for the shutdown timeout"


def test_a_clean_exit_at_the_end_is_still_the_normal_shutdown_round(geomx_job):
    job = geomx_job("stops.py", "--linger-rank", "0", timeouts={"shutdown": f"{SHUTDOWN_S:g}s"})
    job.assert_ok()
    assert job.output.count("trained 6 steps") == 4 and "shut down before" not in job.output, job.tail()


def test_a_hung_worker_is_named_not_the_first_healthy_worker_to_time_out(geomx_job):
    """Round and request timeouts alike (GEOMX_TIMEOUT sets both): the healthy workers' waits run out together with
    the servers' rounds, yet the summary names dc0/worker1, and each healthy worker prints one line."""
    job = geomx_job("stops.py", "--fault", "hang", timeouts={"round": "8s", "request": "8s", "shutdown": "10s"})
    summary = format_summary(job.result)
    assert job.result.exit_code != 0 and job.result.failed == "dc0/worker1", summary
    assert "FAILED (dc0/worker1 sent nothing for round 3 in 8 s)" in summary, summary
    assert "Traceback" not in job.output, job.tail()
    for label in HEALTHY:
        said = re.findall(rf"^\[{re.escape(label)}\] geomx: stopped: .*$", job.output, flags=re.MULTILINE)
        assert len(said) == 1, (label, job.tail())
    assert "waiting for clients ['dc0/worker1']" in job.output  # dc0/worker0 heard its server's verdict
