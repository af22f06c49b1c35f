"""What a new user of a ``lan: collective`` party meets outside the happy path (docs/collective.md, "Several
hosts"), said in one line per rank rather than a traceback through geomx.

- a party's ``torchrun`` pointed at an address where no global tier listens (a typo, or the global tier not started
  yet): each rank waits out the register timeout, then says whom it waited for and what the connection saw, as
  ``geomx.node`` says it for a server. Before: each rank printed a 30-line traceback through the wrapper,
  ``geomx.kv`` and ``geomx.cluster.membership`` (``RequestTimeout``), then torchrun's own dump.
- ``examples/lm.py --device cuda`` (docs/pytorch.md) where torch sees no GPU: one line saying so. Before: every rank's
  ``ZeroDivisionError: integer modulo by zero`` from ``gx.local_rank() % torch.cuda.device_count()``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from harness import EXAMPLES_DIR, REPO_ROOT, write_topology

from geomx.launch import free_port

pytestmark = pytest.mark.slow

SRC = str(REPO_ROOT / "src" / "geomx")


def test_a_global_tier_nobody_runs_is_one_line_per_rank(tmp_path: Path) -> None:
    register_s = 3
    path = write_topology(tmp_path / "job.yaml", parties={"dc0": 1, "dc1": 1}, timeouts={"register": f"{register_s}s"},
                          lan={"dc0": "collective", "dc1": "collective"})
    address = f"127.0.0.1:{free_port()}"
    env = {**os.environ, "GEOMX_TOPOLOGY": str(path), "GEOMX_PARTY": "dc1", "GEOMX_GLOBAL_SCHEDULER": address,
           "GEOMX_HOST": "127.0.0.1"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1",
                           str(EXAMPLES_DIR / "cnn_torch.py"), "--epochs", "1"],
                          env=env, capture_output=True, text=True, timeout=120)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    said = [line for line in output.splitlines() if line.startswith("geomx: ")]
    assert len(said) == 1, output
    assert f"the global scheduler at {address} did not complete this node's registration within {register_s} s: " \
           "nothing listens there" in said[0], output
    assert f'File "{SRC}' not in output and "RequestTimeout" not in output, output  # torchrun's own report may follow


def test_lm_on_cuda_without_a_gpu_says_so_in_one_line(geomx_job, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPU, whatever the machine has
    job = geomx_job(EXAMPLES_DIR / "lm.py", "--device", "cuda", "--steps", "1", "--max-chars", "20000",
                    parties={"dc0": 1, "dc1": 1}, lan={"dc0": "collective", "dc1": "collective"})
    assert job.result.exit_code != 0, job.tail()
    said = [line for line in job.output.splitlines() if "lm.py: --device cuda" in line]
    assert said and all(line.endswith("torch sees no CUDA device here (torch.cuda.is_available() is False): run "
                                      "with --device cpu") for line in said), job.tail()
    assert "Traceback" not in job.output and "ZeroDivisionError" not in job.output, job.tail()
