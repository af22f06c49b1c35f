"""The kvstore API's small error paths, in real jobs: refusals that name the call and send nothing, two pushes of a
key before its pull (MXNet's semantics: the pull returns the value after both, as one process would compute it),
an earlier push's failure raised at the pull, and Ctrl-C while ``kv.create`` waits for registration.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import jobkit
import pytest
import torch
from harness import write_topology
from kv_calls import LR, MOMENTUM, SHAPES, gradient

pytestmark = pytest.mark.slow

NUM_WORKERS = 2  # dc0 and dc1, one worker each: every round crosses both tiers


def _reference(steps: int) -> list[torch.Tensor]:
    """One process's weights after ``steps`` steps of torch's SGD on the workers' mean gradients (the servers'
    default ``rescale_grad`` is 1 / num_all_workers)."""
    params = [torch.zeros(shape, requires_grad=True) for shape in SHAPES]
    opt = torch.optim.SGD(params, lr=LR, momentum=MOMENTUM)
    for step in range(1, steps + 1):
        for key, param in enumerate(params):
            param.grad = sum(gradient(rank, step, key) for rank in range(NUM_WORKERS)) / NUM_WORKERS
        opt.step()
    return [p.detach() for p in params]


def test_refusals_two_pushes_before_a_pull_and_an_earlier_failure(geomx_job):
    job = geomx_job("kv_calls.py", parties={"dc0": 1, "dc1": 1}, slice_elems=50)
    job.assert_ok()
    reports = {int(p.stem.removeprefix("kv_calls")): json.loads(p.read_text())
               for p in sorted((job.run_dir / jobkit.OUT_DIR).glob("kv_calls*.json"))}
    assert sorted(reports) == list(range(NUM_WORKERS))
    for rank, report in reports.items():
        refused = report["refused"]
        unknown = refused["pull_unknown"]
        assert unknown["key_error"] and unknown["outcome"] == "UnknownKeyError", (rank, unknown)
        assert unknown["text"] == "key 3 was never initialized: call kv.init(3, tensor) before pushing or pulling " \
                                  "it (known keys: 0, 1)", (rank, unknown)
        assert refused["push_unknown_second"]["text"].startswith("key 3 was never initialized"), (rank, refused)
        assert refused["push_short"] == {"outcome": "ValueError", "key_error": False,
                                         "text": "push got 2 keys but 1 value: pass one tensor per key"}, rank
        assert refused["pull_short"]["text"] == "pull got 2 keys but 1 output: pass one tensor per key", rank
        assert refused["pushpull_short_out"]["text"] == "pushpull got 2 keys but 1 output: pass one tensor per " \
                                                        "key", rank
        # nothing of a refused call was sent: the rounds that follow are the reference's steps 1-2, then 3
        for name, steps in (("after_two_pushes", 2), ("after_three_pushes", 3)):
            for key, (got, want) in enumerate(zip(report[name], _reference(steps), strict=True)):
                assert torch.allclose(torch.tensor(got), want, atol=1e-6), (rank, name, key, got, want.tolist())
        failed = report["earlier_push_failed"]  # dropped silently before: the pull took the second push's answer
        assert failed["outcome"] == "RemoteError" and "float64" in failed["text"] and "key 0" in failed["text"], \
            (rank, failed)


def test_ctrl_c_while_create_waits_for_registration_exits_130_quietly(tmp_path: Path, reserved_port):
    """A worker started by hand against a scheduler address nothing listens at waits in ``kv.create`` (it warns
    after a few seconds); Ctrl-C there ends it with 130 and no traceback, as it ends a scheduler or a server."""
    path = write_topology(tmp_path / "job.yaml", parties={"dc0": 1}, timeouts={"register": "120s"})
    address = f"127.0.0.1:{reserved_port()}"
    env = {**os.environ, "GEOMX_ROLE": "worker", "GEOMX_TOPOLOGY": str(path), "GEOMX_PARTY": "dc0",
           "GEOMX_SCHEDULER": address, "GEOMX_GLOBAL_SCHEDULER": address}
    proc = subprocess.Popen([sys.executable, "-c", "import geomx; geomx.kv.create()"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    waiting = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "waiting for the scheduler" in line:
                waiting.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert waiting.wait(90), "".join(lines)  # inside create's registration wait
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=30)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    reader.join(timeout=10)
    output = "".join(lines)
    assert code == 130, output
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output
