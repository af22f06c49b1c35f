"""Running the bench's jobs: write a topology, launch it, read its records; the machine's description.

Every section that trains or moves tensors through real processes goes through here, so that each run
leaves the same files (``OUT/topologies/NAME.yaml``, ``OUT/logs/NAME.log``, ``OUT/runs/NAME/``) and a
failure is reported the same way.

Usage::

    topology = write_topology(out_dir / "topologies" / "x.yaml", training_topology("hips"))
    result, figures = measure("sync", "x", topology, command, out_dir, summarize, errors)
"""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from ..launch import KILL_WAIT_S, LaunchResult, launch
from ..runs.runlog import read_metrics
from .tables import say

Records = list[dict[str, Any]]
Metrics = dict[str, Records]

# The emulated WAN of the training, sync and codecs sections (the demo topology's links).
WAN = {"bandwidth": "100Mbit", "latency": "25ms"}
LAN = {"bandwidth": "10Gbit", "latency": "0ms"}


def training_topology(mode: str) -> dict[str, Any]:
    """2 parties x 2 workers, one global server, on the WAN and LAN above, in ``mode`` (``flat`` or ``hips``)."""
    return {
        "parties": {"dc0": {"workers": 2}, "dc1": {"workers": 2}},
        "central": "dc0",
        "global_servers": 1,
        "mode": mode,
        "links": {"lan": dict(LAN), "wan": dict(WAN)},
    }


def free_port() -> int:
    """A TCP port on 127.0.0.1 that the OS says is free now (for the gloo rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def machine_info() -> dict[str, Any]:
    """Cores, Python, torch, pyzmq and libzmq versions: what every bench.json says it ran on."""
    info: dict[str, Any] = {
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": _version("torch"),
        "numpy": _version("numpy"),
        "pyzmq": _version("pyzmq"),
        "geomx": _version("geomx"),
    }
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
    except Exception:  # torch missing or broken: the bench still reports what it can
        pass
    try:
        import zmq

        info["libzmq"] = zmq.zmq_version()
    except Exception:
        pass
    return info


def load_avg() -> list[float] | None:
    """The 1, 5 and 15-minute load averages, rounded (None where the OS has none): printed beside every figure."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def write_topology(path: Path, raw: dict[str, Any]) -> Path:
    """Write ``raw`` as a YAML topology file at ``path`` (folders made) and return the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def run_job(name: str, topology: Path, command: list[str], out_dir: Path, party: str | None = None,
            global_scheduler: str | None = None, resume: bool = False) -> tuple[LaunchResult, Metrics]:
    """Launch a whole topology locally (or only ``party``, joining the global scheduler at ``global_scheduler``,
    as ``geomx launch --party`` on the party's own host; ``resume``: as ``--resume``, from the topology's
    checkpoints); child output goes to OUT/logs/NAME.log. Returns (result, metrics).

    A Ctrl-C that stopped the job is raised again here as KeyboardInterrupt, so that the bench stops too.
    """
    run_dir = out_dir / "runs" / name
    if run_dir.exists():
        shutil.rmtree(run_dir)  # metrics files are appended to: start clean
    log_path = out_dir / "logs" / f"{name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        result = launch(topology, command, run_dir=run_dir, out=log, party=party, global_scheduler=global_scheduler,
                        resume=resume)
    if result.exit_code != 0 and result.failed is None:  # Ctrl-C: the launcher stopped the job
        raise KeyboardInterrupt
    return result, read_metrics(run_dir)


def master_records(metrics: Metrics) -> Records:
    """The metric records of the one worker that records (the master worker)."""
    for name in sorted(metrics):
        if metrics[name]:
            return metrics[name]
    return []


def all_records(metrics: Metrics) -> Records:
    """Every recording worker's records, in worker-name order (``dc0_worker0`` first), each with ``worker``."""
    return [{"worker": name, **record} for name in sorted(metrics) for record in metrics[name]]


Summarize = Callable[[Records, dict[str, Any], float], dict[str, Any]]


def measure(section: str, name: str, topology: Path, command: list[str], out_dir: Path, summarize: Summarize,
            errors: list[str], records_of: Callable[[Metrics], Records] = master_records,
            ) -> tuple[LaunchResult, dict[str, Any] | None]:
    """Run one job and summarize its records (default: the master worker's; ``records_of`` picks others).

    A failure is noted in ``errors`` and gives figures None; the figures get ``load_avg_after``.
    """
    result, metrics = run_job(name, topology, command, out_dir)
    if result.exit_code != 0:
        errors.append(f"{name} failed ({result.failed}); see {out_dir / 'logs' / name}.log")
        say(f"[{section}] {name} FAILED ({result.failed})")
        return result, None
    try:
        figures = summarize(records_of(metrics), result.summary, result.wall_s)
    except (KeyError, ValueError, RuntimeError) as exc:
        errors.append(f"{name}: unreadable metrics records ({type(exc).__name__}: {exc})")
        say(f"[{section}] {name}: unreadable metrics records: {exc}")
        return result, None
    figures["load_avg_after"] = load_avg()
    return result, figures


def find_examples() -> Path:
    """examples/ of the source checkout geomx runs from (editable install), or of the cwd.

    Raises RuntimeError naming what to do when neither has ``examples/cnn.py`` (an installed wheel has none).
    """
    here = Path(__file__).resolve()  # src/geomx/bench/jobs.py: the checkout is four levels up
    for candidate in (here.parents[3] / "examples", Path.cwd() / "examples"):
        if (candidate / "cnn.py").is_file():
            return candidate
    raise RuntimeError("examples/cnn.py not found: run geomx bench from a geomx source checkout "
                       "(pip install -e .) or from its root folder")


def warm_caches() -> None:
    """Import torch and load the digits once, untimed, so the first run does not pay a cold file cache."""
    code = "import torch, geomx.kv, geomx.zoo.data; geomx.zoo.data.digits_split()"
    with contextlib.suppress(subprocess.TimeoutExpired):
        subprocess.run([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=120, check=False)


def kill_all(procs: Sequence[subprocess.Popen[bytes]], wait_s: float = KILL_WAIT_S) -> list[int]:
    """SIGKILL every process still running and reap it within ``wait_s`` each (the launcher's bound).

    SIGKILL cannot be refused, but a process stuck in the kernel (D state) is not reaped at once: it is
    reported and left, never waited for without end. Returns the pids left unreaped.
    Usage: ``stuck = kill_all(procs)``.
    """
    stuck = []
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            try:
                proc.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                say(f"[bench] pid {proc.pid} did not exit within {wait_s:g} s of SIGKILL; leaving it")
                stuck.append(proc.pid)
    return stuck
