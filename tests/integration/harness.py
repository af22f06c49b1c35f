"""Helpers of the multi-process integration tests: write a topology, run a whole geomx job, read its outputs.

Every job is real: ``geomx.launch.launch`` starts the schedulers, servers and workers as OS processes that
talk over ZeroMQ on 127.0.0.1 with OS-chosen ports. Worker scripts live in ``workers/``; they share the
model, data, fault injection and checks in ``workers/jobkit.py`` with the tests. ``conftest.py`` puts both
folders on ``sys.path`` and wraps these helpers in fixtures.
"""

from __future__ import annotations

import io
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from geomx.launch import LaunchResult, launch

INTEGRATION_DIR = Path(__file__).resolve().parent
WORKERS_DIR = INTEGRATION_DIR / "workers"
REPO_ROOT = INTEGRATION_DIR.parents[1]
EXAMPLES_DIR = REPO_ROOT / "examples"

if str(WORKERS_DIR) not in sys.path:
    sys.path.insert(0, str(WORKERS_DIR))

import jobkit  # noqa: E402  (needs WORKERS_DIR on sys.path)

WARM_WORKERS_VARIABLE = "TESTS_WARM_WORKERS"  # the warm-worker server's socket (not GEOMX_*: jobs read those)
DEFAULT_TIMEOUTS = {"register": "60s", "request": "60s", "round": "60s", "shutdown": "15s"}


def write_topology(path: Path, *, parties: dict[str, int] | None = None, mode: str = "hips",
                   links: dict[str, dict[str, str]] | None = None, timeouts: dict[str, str] | None = None,
                   slice_elems: int | None = None, global_servers: int = 1, central: str | None = None,
                   hfa: dict[str, int] | None = None, tsengine: dict[str, Any] | None = None,
                   training: dict[str, Any] | None = None, lan: dict[str, str] | None = None) -> Path:
    """Write a topology YAML (default: dc0 and dc1 with two workers each, HiPS, no link emulation); ``lan``: a
    party's LAN tier (``collective`` or ``server``) by name."""
    parties = parties or {"dc0": 2, "dc1": 2}
    raw: dict[str, Any] = {
        "parties": {name: {"workers": count, **({"lan": lan[name]} if lan and name in lan else {})}
                    for name, count in parties.items()},
        "central": central or next(iter(parties)),
        "global_servers": global_servers,
        "mode": mode,
        "timeouts": {**DEFAULT_TIMEOUTS, **(timeouts or {})},
    }
    if links:
        raw["links"] = links
    if slice_elems is not None:
        raw["slice_elems"] = slice_elems
    if hfa is not None:
        raw["hfa"] = hfa
    if tsengine is not None:
        raw["tsengine"] = tsengine
    if training is not None:
        raw["training"] = training
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


@dataclass
class Job:
    """A finished job: the launcher's result, everything the processes printed, and the run folder."""

    result: LaunchResult
    output: str
    run_dir: Path
    topology: Path
    returned_at: float  # time.time() when launch() returned

    @property
    def summary(self) -> dict[str, Any]:
        return self.result.summary

    def workers(self) -> dict[int, tuple[dict[str, list[Any]], dict[str, Any]]]:
        """global rank -> (saved tensors, report) of every worker that got to the end of train.py."""
        return jobkit.load_worker_outputs(self.run_dir)

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.output.splitlines()[-lines:])

    def assert_ok(self) -> None:
        assert self.result.exit_code == 0, (
            f"job failed (exit {self.result.exit_code}, failed={self.result.failed}); output tail:\n{self.tail()}")


def worker_command(script: str | Path, *args: str) -> list[str]:
    """``[python, script, *args]``; a relative ``script`` is one of ``workers/``. Where the test runs with warm
    workers (``TESTS_WARM_WORKERS``, set by ``conftest.py``), ``[python, warm_stub.py, SOCKET, script, *args]``:
    the worker is forked from a process that has imported torch (``warm_workers.py``)."""
    path = Path(script)
    if not path.is_absolute():
        path = WORKERS_DIR / path
    warm = os.environ.get(WARM_WORKERS_VARIABLE)
    stub = [str(INTEGRATION_DIR / "warm_stub.py"), warm] if warm else []
    return [sys.executable, *stub, str(path), *map(str, args)]


def run_job(workdir: Path, script: str | Path, *args: str, name: str = "job", party: str | None = None,
            global_scheduler: str | None = None, topology: Path | None = None, resume: bool = False,
            **topology_options: Any) -> Job:
    """Write ``workdir/<name>.yaml`` (unless ``topology`` is given) and run a whole job (or one party's; with
    ``resume``, as ``geomx launch --resume``).

    Runs ``launch(topology, [python, script, *args], run_dir=..., out=StringIO())``. The processes' output
    is captured and also printed, so pytest shows it when a test fails.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    if topology is None:
        topology = write_topology(workdir / f"{name}.yaml", **topology_options)
    elif topology_options:
        raise TypeError(f"topology given: options {sorted(topology_options)} would be ignored")
    run_dir = workdir / (f"run-{name}" if party is None else f"run-{name}-{party}")
    out = io.StringIO()
    result = launch(topology, worker_command(script, *args), run_dir=run_dir, out=out, party=party,
                    global_scheduler=global_scheduler, resume=resume)
    returned_at = time.time()
    output = out.getvalue()
    label = name if party is None else f"{name}/{party}"
    print(f"===== job {label}: exit {result.exit_code} failed={result.failed} wall {result.wall_s:.1f} s =====")
    print(output)
    return Job(result, output, run_dir, topology, returned_at)


class TierOutput(io.StringIO):
    """What a ``--global-only`` launch prints (its ``out``): ``listening`` is set once the tier says it listens,
    which is when an operator starts the parties (the caller sets it too once the launch has ended)."""

    def __init__(self) -> None:
        super().__init__()
        self.listening = threading.Event()

    def write(self, text: str) -> int:
        written = super().write(text)
        if "the global tier listens at" in self.getvalue():
            self.listening.set()
        return written
