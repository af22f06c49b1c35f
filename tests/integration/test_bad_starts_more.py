"""More bad starts refused by `geomx launch` before any process starts (docs/deployment.md, "Bad starts"): the real
command line, as a user types it. Each used to start the job and fail it once per process (or crash the launcher
with a traceback): now one `geomx launch: ...` line, exit code 2, no run folder, in the time the launcher takes to
import.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from harness import write_topology

pytestmark = pytest.mark.slow

CASES = [  # (topology's blocks, environment, options, worker command, the line)
    ({"hfa": {"k1": 4, "k2": 5}}, {"GEOMX_SYNC": "dist_async"}, [], [sys.executable, "-c", "pass"],
     "HFA and ESync average models synchronously: training.sync dist_async is not; use one of ['dist_sync']"),
    ({}, {"GEOMX_ESYNC": "1"}, [], [sys.executable, "-c", "pass"],
     "ESync runs on HFA with K2 = 1: add `hfa: {k1: 4, k2: 1}` to the topology"),
    ({"hfa": {"k1": 4, "k2": 5}}, {"GEOMX_HFA_K1": "abc"}, [], [sys.executable, "-c", "pass"],
     "GEOMX_HFA_K1 must be an integer, got 'abc'"),
    ({}, {"GEOMX_TIMEOUT": "abc"}, [], [sys.executable, "-c", "pass"],
     "GEOMX_TIMEOUT: cannot read duration 'abc'; write it like '25ms', '1.5s' or '2m' "
     "(units us, ms, s, m, h)"),
    ({}, {}, ["--resume"], [sys.executable, "-c", "pass"],
     "--resume needs a checkpoint folder to resume from: set checkpoint.dir in the topology (or GEOMX_CHECKPOINT_DIR)"),
    ({}, {}, [], ["/nonexistent/python", "x.py"],
     "the worker command '/nonexistent/python' cannot be run: no such file"),
    ({}, {}, ["--global-only", "--global-scheduler", "notanaddress"], [],
     "--global-scheduler 'notanaddress' must be HOST:PORT with a numeric port (0-65535)"),
]


@pytest.mark.parametrize(("blocks", "env", "options", "command", "line"), CASES,
                         ids=["hfa-async", "esync-no-hfa", "hfa-k1", "timeout", "resume", "command", "address"])
def test_a_bad_start_is_one_line_before_any_process(tmp_path, blocks, env, options, command, line):
    path = write_topology(tmp_path / "job.yaml", timeouts={"register": "5s", "shutdown": "2s"}, **blocks)
    run_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "geomx.cli", "launch", str(path), *options, "--run-dir", str(run_dir),
            *(["--", *command] if command else [])]
    started = time.monotonic()
    try:
        done = subprocess.run(argv, env={**os.environ, **env}, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired as late:  # the job was started and ran on: what this test is against
        raise AssertionError(f"still running after 60 s: {late.stdout!r}") from None
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert output.strip() == f"geomx launch: {line}", output  # one line: no process's output, no traceback
    assert not run_dir.exists(), output  # nothing started
    assert time.monotonic() - started < 30, output

