"""Bad starts named early (issue 46): each one a real process started as a user would, the message it prints and
how long it took to print it.

- a WAN codec no registry holds: refused by `geomx launch` before any process starts, and by a torchrun rank
  before it joins;
- a torchrun whose rank count is not the party's worker count: named with both numbers at the rank's start;
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness import WORKERS_DIR, write_topology

from geomx.launch import free_port

pytestmark = pytest.mark.slow

# a rank that would wait this long for a global scheduler nobody runs, had it tried to join
REGISTER_S = 60


def _collective(tmp_path: Path, **options) -> Path:
    return write_topology(tmp_path / "job.yaml", parties={"dc0": 2, "dc1": 2}, lan={"dc0": "collective",
                          "dc1": "collective"}, timeouts={"register": f"{REGISTER_S}s"}, **options)


def _rank_env(path: Path, party: str, rank: int, world: int) -> dict[str, str]:
    """A torchrun rank's environment (torchrun's variables, as the docs' recipe sets GeoMX's) against a global
    scheduler address nobody listens at: a rank that got as far as joining would wait REGISTER_S there."""
    return {**os.environ, "GEOMX_TOPOLOGY": str(path), "GEOMX_PARTY": party,
            "GEOMX_GLOBAL_SCHEDULER": f"127.0.0.1:{free_port()}", "RANK": str(rank), "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port())}


def _run(argv: list[str], env: dict[str, str], timeout: float = 50) -> tuple[int, str, float]:
    started = time.monotonic()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    return done.returncode, done.stdout + done.stderr, time.monotonic() - started


CREATE = "import geomx; geomx.kv.create()"


def test_an_unknown_codec_is_refused_by_launch_before_any_process(tmp_path):
    path = write_topology(tmp_path / "job.yaml", training={"compression": {"type": "zstd"}})
    code, output, _ = _run([sys.executable, "-m", "geomx.cli", "launch", str(path), "--run-dir", str(tmp_path / "run"),
                            "--", sys.executable, "-c", "pass"], dict(os.environ))
    assert code == 2, output
    assert "training.compression {'type': 'zstd'}: unknown codec 'zstd'; known: [" in output, output
    assert "Traceback" not in output and not (tmp_path / "run").exists(), output


@pytest.mark.parametrize(("training", "env", "named"), [
    ({"compression": {"type": "zstd"}}, {}, "training.compression {'type': 'zstd'}: unknown codec 'zstd'"),
    ({}, {"GEOMX_COMPRESSION": "bsc:foo=1"}, "GEOMX_COMPRESSION='bsc:foo=1': codec 'bsc' has no parameter 'foo'"),
    ({"sync": "dist_foo"}, {}, "training.sync 'dist_foo' is unknown"),
    ({}, {"GEOMX_STALENES": "2"}, "GEOMX_STALENES='2': training has unknown fields ['stalenes']"),
])
def test_a_torchrun_rank_refuses_bad_names_before_it_joins(tmp_path, training, env, named):
    path = _collective(tmp_path, training=training)
    code, output, took = _run([sys.executable, "-c", CREATE], {**_rank_env(path, "dc1", 0, 2), **env})
    assert code != 0 and named in output, output
    assert "waiting for" not in output and took < REGISTER_S / 2, (took, output)  # it never tried to join


def test_a_torchrun_with_more_ranks_than_the_party_has_workers_is_named(tmp_path):
    path = _collective(tmp_path)
    env = _rank_env(path, "dc1", 0, 3)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name)
    code, output, took = _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=3",
                               str(WORKERS_DIR / "frontend_train.py")], env)
    assert code != 0, output
    assert "party dc1 has 2 workers in the topology but torchrun started 3 ranks (WORLD_SIZE=3)" in output, output
    assert "is outside" not in output, output  # named, not a data shard's range error later
    assert took < REGISTER_S / 2, (took, output)
