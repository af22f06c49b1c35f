"""A CURVE key the job needs and cannot read (docs/deployment.md, "Encryption"): the real command lines, as a user
types them. `geomx launch` used to start every process, and each printed a SecurityError traceback; now it is one
`geomx launch: ...` line naming the file and its party, exit code 2, nothing started. A node started by hand
(`python -m geomx.node`) says the same in one line.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness import write_topology

from geomx.launch import free_port
from geomx.transport.security import generate_keys

pytestmark = pytest.mark.slow


def _curve_job(tmp_path: Path) -> Path:
    """dc0 (central) and dc1, keys from ``generate_keys`` in ``keys/`` beside the topology, dc1's secret key gone."""
    path = write_topology(tmp_path / "job.yaml", timeouts={"register": "5s", "shutdown": "2s"})
    generate_keys(tmp_path / "keys", ["dc0", "dc1"])
    (tmp_path / "keys" / "dc1.key_secret").unlink()
    path.write_text(path.read_text() + "security:\n  curve_keys: keys\n")  # relative to the topology
    return path


def _run(argv: list[str], env: dict[str, str]) -> tuple[int, str, float]:
    started = time.monotonic()
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired as late:  # the job was started and ran on: what this test is against
        raise AssertionError(f"still running after 60 s: {late.stdout!r}") from None
    return done.returncode, done.stdout + done.stderr, time.monotonic() - started


def test_a_missing_secret_key_is_one_line_from_launch_before_any_process(tmp_path):
    path = _curve_job(tmp_path)
    run_dir = tmp_path / "run"
    code, output, took = _run([sys.executable, "-m", "geomx.cli", "launch", str(path), "--run-dir", str(run_dir),
                               "--", sys.executable, "-c", "pass"], dict(os.environ))
    assert code == 2, output
    assert output.strip() == f"geomx launch: party 'dc1' has no secret key {tmp_path / 'keys' / 'dc1.key_secret'}; " \
                             "this host needs it (from `geomx keygen`)", output  # one line: no process's output
    assert not run_dir.exists(), output  # nothing started
    assert took < 30, output


def test_a_missing_secret_key_is_one_line_from_a_node_started_by_hand(tmp_path):
    path = _curve_job(tmp_path)
    env = {**os.environ, "GEOMX_ROLE": "local_scheduler", "GEOMX_PARTY": "dc1", "GEOMX_TOPOLOGY": str(path),
           "GEOMX_GLOBAL_SCHEDULER": f"127.0.0.1:{free_port()}", "GEOMX_SCHEDULER": f"127.0.0.1:{free_port()}"}
    code, output, took = _run([sys.executable, "-m", "geomx.node"], env)
    assert code == 2, output
    assert output.strip() == f"ERROR configuration error: party 'dc1' has no secret key " \
                             f"{tmp_path / 'keys' / 'dc1.key_secret'}; this host needs it (from `geomx keygen`)", output
    assert took < 30, output
