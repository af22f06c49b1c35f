"""Run one system of the WAN job across a namespace link (or on loopback) and collect its raw figures.

Each system is a set of processes: ranks 0-1 (and geomx's global tier, torchft's lighthouse) inside namespace
A, ranks 2-3 inside B, all logging JSON lines (``geomx.bench.wan.job.JobLog``) into one folder. A run is cut
``cap_s`` after its training began (rank 0's log appeared; its records so far stay valid: the figures then
say ``cut``). Every process is started in its own
session and killed with its group when the run ends, whatever the reason.

Usage::

    with wan_link(100) as link:
        raw = run_system(DDP, link, out_dir / "ddp-100", epochs=10, cap_s=300, job="mlp")
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .netns import Link, free_port_in

LOOPBACK = "127.0.0.1"
STARTUP_S = 300.0  # process start, imports, rendezvous: slow on a loaded machine, not part of any figure


@dataclass(frozen=True)
class System:
    """One row of the table: which runner, with which settings."""

    name: str  # key in the JSON
    label: str  # name in the table
    kind: str  # "ddp" | "local_sgd" | "diloco" | "geomx"
    period: int = 0  # H: local SGD's averaging period, DiLoCo's sync_every, HFA's K1*K2
    hfa: tuple[int, int] | None = None  # geomx: (K1, K2)
    outer: bool = False  # geomx HFA: outer Nesterov on the global server
    compression: dict[str, Any] | None = None  # geomx: WAN codec
    topology_extra: dict[str, Any] = field(default_factory=dict)  # geomx: e.g. {"training": {"p3": True}}
    worker_args: tuple[str, ...] = ()  # more arguments of its bench worker (torchft's streaming: --fragments 2)
    worker: str = "wan_geomx"  # geomx: its bench worker (geomx.bench.workers.X): the kvstore loop or the wrapper
    group_size: int = 1  # diloco: ranks per replica group (2: one group per data center, FSDP2 inside)


@dataclass
class Place:
    """Where each half of the job runs: a namespace (None: this one) and the address its processes use."""

    ns: str | None
    host: str
    ifname: str


def places(link: Link | None) -> tuple[Place, Place]:
    if link is None:
        return Place(None, LOOPBACK, "lo"), Place(None, LOOPBACK, "lo")
    return Place(link.ns_a, link.addr_a, link.dev_a), Place(link.ns_b, link.addr_b, link.dev_b)


def _in(place: Place, argv: list[str]) -> list[str]:
    return argv if place.ns is None else ["ip", "netns", "exec", place.ns, *argv]


def free_port(place: Place) -> int:
    """A port the OS says is free on ``place.host`` (asked inside its namespace)."""
    return free_port_in(place.ns, place.host)


class ProcessSet:
    """Processes of one run, each in its own session, output to ``logs/<label>.log``; all killed on exit."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: list[tuple[str, subprocess.Popen[bytes], bool]] = []

    def start(self, label: str, argv: list[str], env: dict[str, str] | None = None, waited: bool = True) -> None:
        """``waited``: the run ends when every waited process has exited (not so for a lighthouse)."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_dir / f"{label}.log", "wb") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})},
                                    start_new_session=True)
        self.procs.append((label, proc, waited))

    def wait(self, cap_s: float, started: Callable[[], bool], startup_s: float = STARTUP_S,
             on_start: Callable[[], None] | None = None) -> tuple[bool, list[str]]:
        """Wait for the waited processes: at most ``startup_s`` until ``started()`` (training began: then
        ``on_start()``), then at most ``cap_s`` more. Returns (cut at a limit, labels of processes that failed)."""
        deadline = time.monotonic() + startup_s
        training = False
        while time.monotonic() < deadline:
            if not training and started():
                training, deadline = True, time.monotonic() + cap_s
                if on_start is not None:
                    on_start()
            codes = {label: proc.poll() for label, proc, waited in self.procs if waited}
            failed = [label for label, code in codes.items() if code not in (None, 0)]
            if failed:
                return False, failed
            if all(code is not None for code in codes.values()):
                return False, []
            time.sleep(0.2)
        return True, [] if training else [f"startup took longer than {startup_s:g} s"]

    def stop(self) -> None:
        """SIGINT each group (the launcher stops its children), then SIGKILL what is left after 5 s."""
        for sig, grace in ((signal.SIGINT, 5.0), (signal.SIGKILL, 5.0)):
            for _, proc, _ in self.procs:
                if proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, sig)
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and any(p.poll() is None for _, p, _ in self.procs):
                time.sleep(0.1)
        for _, proc, _ in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)


def _worker(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", f"geomx.bench.workers.{module}", *args]


def start_ddp(system: System, a: Place, b: Place, logs: Path, procs: ProcessSet, epochs: int,
              job: str) -> None:
    port = free_port(a)
    period = ["--local-sgd-period", str(system.period)] if system.kind == "local_sgd" else []
    for rank in range(4):
        place = a if rank < 2 else b
        procs.start(f"rank{rank}", _in(place, _worker(
            "ddp", "--rank", str(rank), "--master", f"{a.host}:{port}", "--log", str(logs / f"rank{rank}.jsonl"),
            "--epochs", str(epochs), "--job", job, *period)), env={"GLOO_SOCKET_IFNAME": place.ifname})


def start_diloco(system: System, a: Place, b: Place, logs: Path, procs: ProcessSet, epochs: int,
                 job: str) -> None:
    """A lighthouse in A and one worker per rank; in replica groups of several ranks each group's ranks are
    started as torchrun starts them (``diloco_group_env``), its store on a free port of its namespace."""
    lighthouse = shutil.which("torchft_lighthouse") or str(Path(sys.executable).with_name("torchft_lighthouse"))
    port = free_port(a)
    size = system.group_size
    procs.start("lighthouse", _in(a, [lighthouse, "--min_replicas", str(4 // size), "--bind", f"{a.host}:{port}",
                                      "--join_timeout_ms", "60000"]), waited=False)
    stores = {replica: free_port(a if replica * size < 2 else b) for replica in range(4 // size)}
    for rank in range(4):
        place = a if rank < 2 else b
        replica = rank // size
        who = ("--rank", str(rank)) if size == 1 else ("--group-size", str(size), "--replica-group", str(replica))
        env = {"GLOO_SOCKET_IFNAME": place.ifname}
        if size > 1:
            env.update(diloco_group_env(rank, size, place.host, stores[replica]))
        procs.start(f"rank{rank}", _in(place, _worker(
            "diloco", *who, "--host", place.host, "--lighthouse", f"http://{a.host}:{port}",
            "--sync-every", str(system.period), "--log", str(logs / f"rank{rank}.jsonl"), "--epochs", str(epochs),
            "--job", job, *system.worker_args)), env=env)


def diloco_group_env(rank: int, group_size: int, host: str, port: int) -> dict[str, str]:
    """What torchrun sets for the job's rank ``rank`` in its replica group of ``group_size`` ranks (one torchrun
    per group, on the group's host: its ranks are local ranks too).

    Usage: ``diloco_group_env(3, 2, "10.250.1.2", 29511)["RANK"]`` -> ``"1"``
    """
    group_rank = rank % group_size
    return {"RANK": str(group_rank), "LOCAL_RANK": str(group_rank), "WORLD_SIZE": str(group_size),
            "LOCAL_WORLD_SIZE": str(group_size), "GROUP_RANK": "0", "MASTER_ADDR": host, "MASTER_PORT": str(port)}


def geomx_topology(system: System) -> dict[str, Any]:
    """Two parties of two workers, HiPS, no ``links`` (geomx's emulator off: the kernel shapes the link)."""
    raw: dict[str, Any] = {"parties": {"dc0": {"workers": 2}, "dc1": {"workers": 2}}, "central": "dc0",
                           "global_servers": 1, "mode": "hips",
                           "timeouts": {"register": "120s", "request": "300s", "round": "300s", "shutdown": "60s"}}
    if system.hfa:
        raw["hfa"] = {"k1": system.hfa[0], "k2": system.hfa[1]}
    return {**raw, **system.topology_extra}


def geomx_worker(system: System, logs: Path, epochs: int, job: str) -> list[str]:
    """The worker command of a geomx row: the kvstore loop (its codec and outer optimizer as arguments) or the
    PyTorch wrapper (everything from the topology, as for a user of the wrapper)."""
    common = ("--log-dir", str(logs), "--epochs", str(epochs), "--job", job)
    if system.worker == "wan_torch":
        return _worker("wan_torch", *common)
    return _worker(system.worker, *common, "--compression", json.dumps(system.compression),
                   *(["--outer"] if system.outer else []))


def start_geomx(system: System, a: Place, b: Place, logs: Path, procs: ProcessSet, epochs: int,
                job: str) -> None:
    topology = logs / "topology.yaml"
    topology.parent.mkdir(parents=True, exist_ok=True)
    topology.write_text(yaml.safe_dump(geomx_topology(system), sort_keys=False))
    scheduler = f"{a.host}:{free_port(a)}"
    worker = geomx_worker(system, logs, epochs, job)
    for party, place in (("dc0", a), ("dc1", b)):
        procs.start(party, _in(place, [sys.executable, "-m", "geomx.cli", "launch", str(topology), "--party", party,
                                       "--host", place.host, "--global-scheduler", scheduler,
                                       "--run-dir", str(logs / f"run-{party}"), "--", *worker]),
                    env={"GLOO_SOCKET_IFNAME": "lo"})  # a collective party's group: inside its own host


def wan_streams(out: Path) -> dict[str, dict[str, int]]:
    """geomx's WAN bytes sent by each process of each party (``run-<party>`` folders; a collective party's ranks
    each have a stream of their own): {party: {process: bytes}}; empty for the peers."""
    from ...runs.runlog import read_stats

    streams: dict[str, dict[str, int]] = {}
    for run_dir in sorted(out.glob("run-*")):
        for entry in read_stats(run_dir):
            sent = int(entry.get("wan", {}).get("sent", 0))
            if sent:
                party = str(entry.get("party", "?"))
                streams.setdefault(party, {})[str(entry.get("name", party)).removeprefix(f"{party}/")] = sent
    return streams


STARTERS = {"ddp": start_ddp, "local_sgd": start_ddp, "diloco": start_diloco, "geomx": start_geomx}


def run_system(system: System, link: Link | None, out: Path, epochs: int, cap_s: float,
               job: str = "mlp") -> dict[str, Any]:
    """Run ``system`` on ``job`` across ``link`` (None: loopback, unshaped); returns its records, bytes and wall
    time."""
    if out.exists():
        shutil.rmtree(out)  # JobLog appends: start clean
    out.mkdir(parents=True)
    a, b = places(link)
    before = link.counters() if link else None
    procs = ProcessSet(out / "logs")
    started = time.monotonic()
    try:
        STARTERS[system.kind](system, a, b, out, procs, epochs, job)
        # the link's counters when training began (rank 0's clock started): what set-up sent is not training's
        # (geomx's INIT sends the master's model to the other party; torchft's peer skips its start-up sync)
        at_start: dict[str, int] = {}
        cut, failed = procs.wait(cap_s, started=(out / "rank0.jsonl").exists,
                                 on_start=(lambda: at_start.update(link.counters())) if link else None)
    finally:
        procs.stop()
    wall = time.monotonic() - started
    after = link.counters() if link else None
    records: list[dict[str, Any]] = []
    from .job import read_log
    if (out / "rank0.jsonl").exists():
        records = read_log(out / "rank0.jsonl")
    raw: dict[str, Any] = {"system": system.name, "records": records, "cut_at_cap": cut, "failed": failed,
                           "wall_s": wall, "logs": str(out / "logs"),
                           "settings": {"kind": system.kind, "period": system.period, "hfa": system.hfa,
                                        "outer": system.outer, "compression": system.compression}}
    streams = wan_streams(out)
    if streams:
        raw["wan_streams"] = streams
    if before is not None and after is not None:
        raw["bytes"] = {key: after[key] - before[key] for key in after}
        if at_start:
            raw["bytes_training"] = {key: after[key] - at_start[key] for key in after}
    return raw
