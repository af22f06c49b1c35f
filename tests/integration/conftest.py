"""Fixtures of the multi-process integration tests (the helpers themselves are in ``harness.py``).

Each job starts real processes (schedulers, servers, workers) on 127.0.0.1 with OS-chosen ports, so every
test here gets a hard timeout: a hung job fails its test instead of hanging the suite.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from geomx.launch import PortReservations

_HERE = Path(__file__).resolve().parent
for _folder in (_HERE, _HERE / "workers"):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))

from harness import WARM_WORKERS_VARIABLE, Job, run_job, write_topology  # noqa: E402
from warm_workers import WarmWorkers  # noqa: E402

TEST_TIMEOUT_S = 240


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cold_workers: this module's job workers start as `python script.py`, not "
                                       "forked warm (they are found by /proc environ, stopped, or in a namespace)")


@pytest.fixture(scope="session")
def warm_workers():
    """The warm-worker server of this pytest process (``warm_workers.py``, started on first use), or None where
    ``TESTS_COLD_WORKERS=1`` asks for every worker to start cold."""
    if os.environ.get("TESTS_COLD_WORKERS") == "1":
        yield None
        return
    # a short folder: a Unix socket's path has at most 107 bytes
    folder = Path(tempfile.mkdtemp(prefix="warm-", dir=os.environ.get("TMPDIR", "/tmp")))
    server = WarmWorkers(folder / "sock")
    try:
        yield server
    finally:
        server.close()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module", autouse=True)
def _module_workers(request: pytest.FixtureRequest, warm_workers: WarmWorkers | None):
    """Every job's workers forked warm (``harness.worker_command`` reads the variable), from before the module's own
    fixtures, unless the module is marked ``cold_workers``."""
    with pytest.MonkeyPatch.context() as env:
        if warm_workers is None or request.node.get_closest_marker("cold_workers") is not None:
            env.delenv(WARM_WORKERS_VARIABLE, raising=False)
        else:
            env.setenv(WARM_WORKERS_VARIABLE, str(warm_workers.ensure()))
        yield


@pytest.fixture(autouse=True)
def _test_workers(warm_workers: WarmWorkers | None) -> None:
    """The server started again if a test before this one ended it (at the same socket)."""
    if warm_workers is not None and os.environ.get(WARM_WORKERS_VARIABLE):
        warm_workers.ensure()


@pytest.fixture
def geomx_job(tmp_path: Path):
    """``geomx_job(script, *args, **options)``: run a job in this test's tmp_path (see harness.run_job).

    Options are write_topology's (parties, mode, links, timeouts, slice_elems, global_servers, central, hfa,
    tsengine, training) or
    run_job's (name, party, global_scheduler, topology).
    """

    def run(script: str | Path, *args: str, **options) -> Job:
        return run_job(tmp_path, script, *args, **options)

    return run


@pytest.fixture
def reserved_port():
    """``reserved_port()``: a port on 127.0.0.1 held for this test (for a ``--global-scheduler`` given to
    separately launched parties), so a suite running beside this one cannot take it before the job binds it."""
    with PortReservations("127.0.0.1") as ports:
        yield ports.take


@pytest.fixture(scope="session")
def standard_hips_job(tmp_path_factory: pytest.TempPathFactory) -> Job:
    """The reference job, shared by the FSA and WAN tests: 2 parties x 2 workers, HiPS, SGD with momentum."""
    return run_job(tmp_path_factory.mktemp("standard-hips"), "train.py", name="hips")


@pytest.fixture(scope="session")
def standard_flat_job(tmp_path_factory: pytest.TempPathFactory) -> Job:
    """The same job under a flat parameter server (every worker talks to the global server directly)."""
    return run_job(tmp_path_factory.mktemp("standard-flat"), "train.py", name="flat", mode="flat")


@pytest.fixture(scope="session")
def p3_job(tmp_path_factory: pytest.TempPathFactory):
    """``p3_job(intra_ts)``: frontend_train.py (5 steps, 2 parties x 2 workers) with P3 (64-element slices, SGD
    translated onto the servers, as P3 has it) over two global servers, a slow WAN (20 Mbit/s, 10 ms) and DGT
    without loss (2 channels, K 0.5, a 2 s deadline: a late UDP block would be folded into the next round and change
    the result; CI once saw 5.7% of a tensor differ with the default 50 ms); with ``intra_ts``, TSEngine inside the
    parties. Each job runs once (for the first test that asks), for test_torch_frontend's wrapped-loop and P3 tests
    and test_multigps's P3 + DGT test.
    """
    jobs: dict[bool, Job] = {}

    def get(intra_ts: bool) -> Job:
        if intra_ts not in jobs:
            folder = tmp_path_factory.mktemp("p3-ts" if intra_ts else "p3")
            path = write_topology(folder / "p3.yaml", global_servers=2,
                                  training={"server_optimizer": "translate", "p3": True, "p3_slice_elems": 64},
                                  links={"wan": {"bandwidth": "20Mbit", "latency": "10ms"}},
                                  tsengine={"inter": False, "intra": True, "max_greed": 0.5} if intra_ts else None)
            path.write_text(path.read_text() + "dgt: {channels: 2, k: 0.5, block_bytes: 64, deadline: 2s}\n")
            jobs[intra_ts] = run_job(folder, "frontend_train.py", "--steps", "5", topology=path,
                                     name="p3-ts" if intra_ts else "p3")
        return jobs[intra_ts]

    return get
