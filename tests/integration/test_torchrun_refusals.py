"""A configuration that cannot start, met by the user's own script (the PyTorch wrapper's entry points), is said in
one line per process: ``geomx: <the reason>``, exit code 1, no traceback through geomx.

- a party the topology lacks, under torchrun (``examples/cnn_torch.py``: ``gx.shard`` reads the configuration);
- a torchrun with more ranks than the party's workers;
- a DDP script (``examples/ddp_torch.py``) under a ``lan: server`` topology: ``gx.init_process_group`` names the
  tier, where torch's own call failed for the RANK nobody sets there.

Before: each rank printed an 85-121-line traceback through ``gx.shard`` into ``geomx/config/env.py`` (the message at
its bottom), and each DDP worker torch's ``environment variable RANK expected, but not set``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from harness import EXAMPLES_DIR, REPO_ROOT, run_job, write_topology

from geomx.launch import free_port

pytestmark = pytest.mark.slow

SRC = str(REPO_ROOT / "src" / "geomx")


def _torchrun(tmp_path: Path, party: str, ranks: int) -> tuple[int, str]:
    """examples/cnn_torch.py under ``torchrun --standalone`` as one party of a collective job, started by hand
    against a global scheduler address nobody listens at (a rank that got as far as joining would wait there)."""
    path = write_topology(tmp_path / "job.yaml", lan={"dc0": "collective", "dc1": "collective"})
    env = {**os.environ, "GEOMX_TOPOLOGY": str(path), "GEOMX_PARTY": party,
           "GEOMX_GLOBAL_SCHEDULER": f"127.0.0.1:{free_port()}"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           f"--nproc-per-node={ranks}", str(EXAMPLES_DIR / "cnn_torch.py"), "--epochs", "1"],
                          env=env, capture_output=True, text=True, timeout=120)
    return done.returncode, done.stdout + done.stderr


def _said_once_per_rank(output: str, text: str, ranks: int) -> None:
    lines = [line for line in output.splitlines() if line.startswith("geomx: ")]
    assert len(lines) == ranks and all(text in line for line in lines), output
    assert f'File "{SRC}' not in output and "ConfigError" not in output, output  # torchrun's own report may follow


def test_a_party_the_topology_lacks_is_one_line_per_rank(tmp_path):
    code, output = _torchrun(tmp_path, "dc9", 2)
    assert code != 0, output
    _said_once_per_rank(output, "GEOMX_PARTY='dc9' is not a party of the topology ['dc0', 'dc1']", 2)


def test_more_ranks_than_the_party_has_workers_is_one_line_per_rank(tmp_path):
    code, output = _torchrun(tmp_path, "dc1", 3)
    assert code != 0, output
    _said_once_per_rank(output, "party dc1 has 2 workers in the topology but torchrun started 3 ranks", 3)


def test_a_ddp_script_under_a_server_topology_is_told_its_tier(tmp_path):
    job = run_job(tmp_path, EXAMPLES_DIR / "ddp_torch.py", "--epochs", "1")  # the default topology: lan: server
    assert job.result.exit_code != 0, job.tail()
    said = [line for line in job.output.splitlines() if "geomx: this topology's parties are lan: server" in line]
    assert said and all("needs lan: collective" in line for line in said), job.tail()
    assert "Traceback" not in job.output and "RANK expected" not in job.output, job.tail()
