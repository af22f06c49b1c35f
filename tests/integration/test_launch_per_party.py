"""The per-party launch form: each data center runs `geomx launch --party NAME` against one global scheduler.

Here both halves run on this host, in two threads, against a global scheduler port chosen up front.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading

import jobkit
from harness import run_job, worker_command, write_topology


def _labels(output: str) -> set[str]:
    """The processes that printed something (the launcher prefixes each line with its process label)."""
    labels = {match.group(1) for match in re.finditer(r"^\[([^\]]+)\] ", output, re.MULTILINE)}
    return labels - {"geomx launch"}


def test_two_parties_launched_separately_train_together(tmp_path, reserved_port):
    topology = write_topology(tmp_path / "split.yaml")
    global_scheduler = f"127.0.0.1:{reserved_port()}"
    jobs: dict[str, object] = {}
    errors: dict[str, BaseException] = {}

    def launch_party(party: str) -> None:
        try:
            jobs[party] = run_job(tmp_path, "train.py", name="split", party=party,
                                  global_scheduler=global_scheduler, topology=topology)
        except BaseException as exc:
            errors[party] = exc

    threads = [threading.Thread(target=launch_party, args=(party,)) for party in ("dc1", "dc0")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    for party in ("dc0", "dc1"):
        jobs[party].assert_ok()
    dc0, dc1 = jobs["dc0"], jobs["dc1"]
    # each launcher ran only its own party's processes ...
    assert _labels(dc0.output) == {"global_scheduler", "global_server0", "dc0/scheduler", "dc0/server",
                                   "dc0/worker0", "dc0/worker1"}, _labels(dc0.output)
    assert _labels(dc1.output) == {"dc1/scheduler", "dc1/server", "dc1/worker0", "dc1/worker1"}
    # ... and the workers of both parties trained one model together
    workers = {**dc0.workers(), **dc1.workers()}
    assert sorted(dc0.workers()) == [0, 1] and sorted(dc1.workers()) == [2, 3]
    jobkit.assert_fsa_equivalent(workers, num_workers=4)
    # dc1's local server was the only WAN client of the global server
    assert dc1.summary["wan_bytes_sent_by_party"] == {"dc1": dc1.summary["wan_bytes"]}
    assert dc1.summary["wan_bytes"] >= jobkit.STEPS * jobkit.param_bytes()


def test_cli_accepts_options_after_the_topology(tmp_path):
    topology = write_topology(tmp_path / "solo.yaml", parties={"dc0": 1})
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "geomx.cli", "launch", str(topology), "--party", "dc0", "--run-dir", str(run_dir),
         "--", *worker_command("train.py")],
        capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "status        : ok" in proc.stdout
    jobkit.assert_fsa_equivalent(jobkit.load_worker_outputs(run_dir), num_workers=1)
