"""`geomx launch`: start every process of a topology (or one party's) and watch them.

Each role is its own OS process. Schedulers and servers run ``python -m geomx.node``; workers run the
user's command. Every output line is prefixed with the process's party and role. Ctrl-C is forwarded.
When a process fails, the rest are stopped and the launcher exits non-zero naming it. When the workers
finish, the launcher prints a summary: wall time, bytes over LAN and WAN, and the master worker's last
metrics record (e.g. its test accuracy).

Usage::

    geomx launch topologies/demo.yaml -- python examples/cnn.py --epochs 8
    geomx launch topologies/demo.yaml --party dc1 --global-scheduler 10.0.0.1:9000 --host 10.0.0.2 -- ...
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from .algorithms.registry import SYNC_POLICIES, SYNCHRONOUS
from .cluster.addresses import announce_when_listening as announce_tier
from .cluster.addresses import claim
from .cluster.ports import PortReservations, distinct_free_ports
from .cluster.ports import free_port as free_port  # (a public name here: tests and benchmarks use it)
from .cluster.processes import KILL_WAIT_S, STOP_GRACE_S, alive, descendants, die_with_parent, signal_tree
from .cluster.processes import job_processes as job_processes  # (where fault injection has always found it)
from .cluster.status_page import announce_when_listening
from .config import ConfigError, Mode, NodeConfig, Role, Topology, TorchRun, job_status, job_topology, node_env
from .config.combinations import check_training
from .config.preflight import check_processes, check_start
from .runs.runlog import earlier_job
from .runs.summary import blame, summarize, summary_text
from .server.compose import check_plugins
from .transport.security import check_keys

# Environment defaults for every launched process (the user's environment wins):
# - many processes share this machine's cores: one math thread each;
# - glibc keeps freed receive buffers instead of returning them to the OS, so the next message of the same
#   size does not page-fault fresh memory in (measured: 3.5x fewer page faults, ~25% less CPU per 100 MB
#   pushpull).
FAILURE_SETTLE_S = 1.0  # after a process fails, how long the others may go on to report it themselves
INTERRUPT_SETTLE_S = 2.0  # after Ctrl-C is passed on, how long the processes may take to write their counts and end
TREE_EVERY_S = 1.0  # how often the launcher notes the processes below its own (``descendants``)

PROCESS_DEFAULTS = {
    "OMP_NUM_THREADS": "1",
    "MALLOC_ARENA_MAX": "2",
    "MALLOC_MMAP_THRESHOLD_": str(64 << 20),
    "MALLOC_TRIM_THRESHOLD_": str(1 << 30),
}


@dataclass
class ProcessSpec:
    """One process to start: a label for its log lines, its command and its environment."""

    label: str
    argv: list[str]
    env: dict[str, str]
    is_worker: bool


def process_env(spec: ProcessSpec) -> dict[str, str]:
    """The environment ``spec``'s process starts with: the defaults, the launcher's own, then the spec's."""
    return {**PROCESS_DEFAULTS, **os.environ, **spec.env, "PYTHONUNBUFFERED": "1"}


@dataclass
class LaunchResult:
    exit_code: int
    wall_s: float
    failed: str | None
    summary: dict[str, Any] = field(default_factory=dict)
    exit_codes: dict[str, int] = field(default_factory=dict)  # label -> return code (-N: ended by signal N)


class LaunchInterrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM stopped the job, and the caller had Python's own handler for it (a library caller, a test
    runner): the job's processes are ended, then this is raised, carrying the job's ``result`` (exit code 130) and
    the ``signum``. ``geomx launch`` catches it and prints the summary.

    Usage: ``except LaunchInterrupted as stop: print(format_summary(stop.result)); raise``
    """

    def __init__(self, result: LaunchResult, signum: int) -> None:
        super().__init__(f"the job was stopped by signal {signum}")
        self.result = result
        self.signum = signum


def plan_processes(topology: Topology, topology_path: Path, command: list[str], run_dir: Path, *,
                   host: str = "127.0.0.1", global_scheduler: str | None = None,
                   parties: list[str] | None = None, resume: bool = False, join: bool = False,
                   ports: PortReservations | None = None, global_only: bool = False) -> list[ProcessSpec]:
    """Every process of the topology (or of ``parties`` only), with the environment each one needs.

    ``resume``: the global servers start from their newest valid checkpoint. ``ports``: where the schedulers'
    ports are picked and held until the caller closes it (default: picked and released at once).
    ``global_only``: the global scheduler and servers alone (every party, collective ones under their own
    torchrun, joins them from its hosts). ``join``: the central party beside a tier that runs already.
    """
    if not command and not global_only:
        raise ValueError("no worker command given: geomx launch TOPOLOGY.yaml -- python train.py ...")
    if topology.job_start is None:  # the origin of the topology's emulated outages, the same for every process
        topology = dataclasses.replace(topology, job_start=time.time())
    selected = [] if global_only else parties or [p.name for p in topology.parties]
    for name in selected:
        topology.party(name)  # raises on unknown party
    pick_port = ports.take if ports is not None else distinct_free_ports(host)
    global_address = global_scheduler or f"{host}:{pick_port()}"
    node_cmd = [sys.executable, "-m", "geomx.node"]
    specs: list[ProcessSpec] = []

    def add(label: str, node: NodeConfig, argv: list[str], is_worker: bool = False) -> None:
        specs.append(ProcessSpec(label, argv, node_env(node, topology_path.resolve()), is_worker))

    def node(role: Role, party: str, scheduler: str | None = None, rank: int | None = None,
             is_master: bool = False, torchrun: TorchRun | None = None) -> NodeConfig:
        return NodeConfig(role=role, party=party, topology=topology, global_scheduler=global_address,
                          scheduler=scheduler, rank=rank, is_master=is_master, bind_host=host, run_dir=run_dir,
                          resume=resume and role in (Role.GLOBAL_SERVER, Role.WORKER), torchrun=torchrun)

    if (topology.central in selected and not join) or global_only:
        add("global_scheduler", node(Role.GLOBAL_SCHEDULER, topology.central), node_cmd)
        for shard in range(topology.num_global_servers):
            add(f"global_server{shard}", node(Role.GLOBAL_SERVER, topology.central, rank=shard), node_cmd)
    for name in selected:
        party = topology.party(name)
        scheduler = None
        if topology.is_collective(name):  # one torch.distributed group, as torchrun would start it
            master_port = pick_port()
            for rank in range(party.num_workers):
                run = TorchRun(rank=rank, world_size=party.num_workers, local_rank=rank,
                               local_world_size=party.num_workers, master_addr=host, master_port=master_port)
                add(f"{name}/worker{rank}", node(Role.WORKER, name, None, rank, name == topology.central and rank == 0,
                                                 torchrun=run), list(command), is_worker=True)
            continue
        if topology.mode is Mode.HIPS:
            scheduler = f"{host}:{pick_port()}"
            add(f"{name}/scheduler", node(Role.LOCAL_SCHEDULER, name, scheduler), node_cmd)
            add(f"{name}/server", node(Role.LOCAL_SERVER, name, scheduler), node_cmd)
        for rank in range(party.num_workers):
            is_master = name == topology.central and rank == 0
            add(f"{name}/worker{rank}", node(Role.WORKER, name, scheduler, rank, is_master), list(command),
                is_worker=True)
    return specs


class Launcher:
    """Starts the planned processes, relays their output, stops everything on the first failure."""

    def __init__(self, specs: list[ProcessSpec], run_dir: Path, shutdown_grace_s: float = 30.0,
                 out: IO[str] | None = None) -> None:
        self.specs = specs
        self.run_dir = run_dir
        self.grace = shutdown_grace_s
        self.out = out or sys.stdout
        self._procs: list[tuple[ProcessSpec, subprocess.Popen[bytes]]] = []
        self._print_lock = threading.Lock()
        self._readers: list[threading.Thread] = []
        self._interrupted = False
        self._signal: int | None = None  # the signal that stopped the job (None: stop() or no stop)
        # every process ever seen below ours (pid -> start time), refreshed as the job runs and before any stop: a
        # grandchild in a session of its own is out of reach of the process groups, and once its parent is gone
        # its parent pid no longer leads here
        self._tree: dict[int, str] = {}
        self._tree_at = 0.0

    def stop(self) -> None:
        """Stop the job as Ctrl-C would (from another thread); ``run`` then returns."""
        self._on_interrupt(signal.SIGINT, None)

    def pids(self) -> dict[str, int]:
        """Label -> pid of every process started so far (e.g. to find a job's ports)."""
        return {spec.label: proc.pid for spec, proc in list(self._procs)}

    def _say(self, text: str) -> None:
        with self._print_lock:
            self.out.write(text + "\n")
            self.out.flush()

    def _relay(self, label: str, stream: IO[bytes]) -> None:
        for raw in iter(stream.readline, b""):
            self._say(f"[{label}] {raw.decode(errors='replace').rstrip()}")
        stream.close()

    def _start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        arm = die_with_parent()  # a launcher killed by SIGKILL leaves no process behind: each gets SIGTERM
        for spec in self.specs:
            try:  # (launch() checked the worker command; a program gone since is named, and the others stopped)
                proc = subprocess.Popen(spec.argv, env=process_env(spec), stdout=subprocess.PIPE, preexec_fn=arm,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
            except OSError as exc:
                raise ConfigError(f"{spec.label} cannot start {spec.argv[0]!r}: {exc.strerror or exc}") from None
            self._procs.append((spec, proc))
            assert proc.stdout is not None
            reader = threading.Thread(target=self._relay, args=(spec.label, proc.stdout), daemon=True)
            reader.start()
            self._readers.append(reader)

    def _signal_all(self, sig: int) -> None:
        for _, proc in self._procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, sig)

    def _see_tree(self) -> dict[int, str]:
        """Add the processes below ours now to ``_tree`` (a /proc scan, a few ms) and return it."""
        still = {pid: started for pid, started in self._tree.items() if alive(pid, started)}
        self._tree = {**still, **descendants([proc.pid for _, proc in self._procs if proc.poll() is None])}
        self._tree_at = time.monotonic()
        return self._tree

    def _stop_all(self, grace: float) -> None:
        tree = self._see_tree()  # a torchrun rank, a user's helper: in a session of its own
        self._signal_all(signal.SIGTERM)
        signal_tree(tree, signal.SIGTERM)
        # a stopped process (SIGSTOP, a debugger's, a frozen host's) keeps SIGTERM pending until it runs again: wake
        # it, so that it ends now instead of at the SIGKILL after ``grace`` (systemd sends the same pair)
        self._signal_all(signal.SIGCONT)
        signal_tree(tree, signal.SIGCONT)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and (any(p.poll() is None for _, p in self._procs)
                                               or any(alive(pid, started) for pid, started in tree.items())):
            time.sleep(0.05)
        self._signal_all(signal.SIGKILL)
        signal_tree(tree, signal.SIGKILL)
        for spec, proc in self._procs:
            try:  # SIGKILL is not refused; a process stuck in the kernel (D state) is reported, not waited for
                proc.wait(timeout=KILL_WAIT_S)
            except subprocess.TimeoutExpired:
                self._say(f"[geomx launch] {spec.label} (pid {proc.pid}) did not exit within {KILL_WAIT_S:g} s "
                          "of SIGKILL; leaving it")

    def _on_interrupt(self, signum: int, _frame: Any) -> None:
        self._interrupted = True
        tree = self._see_tree()  # before anything ends: its children would be orphaned out of sight
        self._signal_all(signal.SIGINT)
        signal_tree(tree, signal.SIGINT)

    def _on_signal(self, signum: int, frame: Any) -> None:
        """SIGINT or SIGTERM to the launcher: stop the job (its processes get Ctrl-C, then SIGTERM)."""
        self._signal = signum
        self._on_interrupt(signum, frame)

    def _pass_on(self, previous: dict[int, Any], result: LaunchResult) -> None:
        """After the job stopped for a signal: hand it to the handler that was there before ``run`` (a command
        running several jobs, ``StopOnSignals``), so that command stops too instead of starting its next job.
        Where that handler was Python's own (Ctrl-C's ``KeyboardInterrupt``, SIGTERM's default), the caller gets
        ``LaunchInterrupted`` with the result: it stops too, and ``geomx launch`` prints its summary and exits 130.
        An ignored signal stays ignored."""
        if self._signal is None:
            return
        handler = previous.get(self._signal)
        if handler in (signal.default_int_handler, signal.SIG_DFL):
            raise LaunchInterrupted(result, self._signal)
        if callable(handler):
            handler(self._signal, None)

    def run(self) -> LaunchResult:
        started, began = time.monotonic(), time.time()  # (began: what this run wrote in the folder, for its summary)
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)} \
            if threading.current_thread() is threading.main_thread() else {}
        failed: str | None = None
        code = 0
        try:
            self._start()
            workers_done_at: float | None = None
            failed_at: float | None = None
            while True:
                if time.monotonic() - self._tree_at > TREE_EVERY_S:
                    self._see_tree()
                for spec, proc in self._procs:
                    rc = proc.poll()
                    if rc not in (None, 0) and failed is None and not self._interrupted:
                        failed, failed_at = spec.label, time.monotonic()
                        code = 1
                        self._say(f"[geomx launch] {spec.label} exited with code {rc}; stopping the other "
                                  f"processes in {FAILURE_SETTLE_S:g} s")
                # after a failure the others get a moment to notice it and say so themselves (a dead global
                # server is named by every party's server), then they are stopped
                settled = failed_at is not None and (time.monotonic() - failed_at > FAILURE_SETTLE_S
                                                     or all(p.poll() is not None for _, p in self._procs))
                if self._interrupted and not settled:
                    # Ctrl-C was passed on: the processes may write their last counts and end by themselves
                    deadline = time.monotonic() + INTERRUPT_SETTLE_S
                    while time.monotonic() < deadline and any(p.poll() is None for _, p in self._procs):
                        time.sleep(0.05)
                if settled or self._interrupted:
                    self._stop_all(STOP_GRACE_S)
                    code = code or 130
                    break
                if all(p.poll() is not None for _, p in self._procs):
                    break
                workers = [p for s, p in self._procs if s.is_worker]
                if workers_done_at is None and workers and all(p.poll() is not None for p in workers):
                    workers_done_at = time.monotonic()
                if workers_done_at is not None and time.monotonic() - workers_done_at > self.grace:
                    stuck = [s.label for s, p in self._procs if p.poll() is None]
                    self._say(f"[geomx launch] workers finished but {stuck} did not exit within "
                              f"{self.grace:g} s; stopping them")
                    failed, code = stuck[0], 1
                    self._stop_all(STOP_GRACE_S)
                    break
                time.sleep(0.05)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if any(p.poll() is None for _, p in self._procs):
                self._stop_all(2.0)
            for reader in self._readers:
                reader.join(timeout=2)
        wall = time.monotonic() - started
        codes = {spec.label: proc.returncode for spec, proc in self._procs if proc.returncode is not None}
        summary = summarize(self.run_dir, wall, since=began, processes=self.pids())
        result = LaunchResult(code, wall, blame(summary, failed, codes), summary, codes)  # (who stopped sending)
        self._pass_on(previous, result)
        return result


def format_summary(result: LaunchResult) -> str:
    """The summary a launch prints (``geomx.runs.summary.summary_text``)."""
    return summary_text(result.exit_code, result.failed, result.wall_s, result.summary)


def reserve_status_page(topology: Topology, specs: list[ProcessSpec], host: str,
                        ports: PortReservations) -> str | None:
    """The global scheduler's status page, if this launch starts it: its port is held in ``ports`` (made for the
    page's host: a free port for port 0; a set port is checked free, else a ConfigError naming it) and handed to
    the scheduler (GEOMX_STATUS_PORT); returns the page's URL, None when the page is off or another host runs
    the scheduler."""
    status = job_status(topology, os.environ)
    scheduler = next((s for s in specs if s.env.get("GEOMX_ROLE") == Role.GLOBAL_SCHEDULER.value), None)
    if scheduler is None or not status.enabled:
        return None
    try:
        port = ports.take() if status.port == 0 else ports.hold(status.port)
    except OSError as exc:
        raise ConfigError(f"status.port {status.port} (GEOMX_STATUS_PORT) cannot be bound at {status.host}: "
                          f"{exc.strerror or exc}; pick another, or 0 for a free one") from None
    scheduler.env["GEOMX_STATUS_PORT"] = str(port)
    shown = host if status.host in ("0.0.0.0", "") else status.host
    return f"http://{shown}:{port}/"


def default_run_dir(topology_path: Path) -> Path:
    return Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{topology_path.stem}-{os.getpid()}"


def launch(topology_path: Path, command: list[str], *, run_dir: Path | None = None, host: str = "127.0.0.1",
           party: str | None = None, global_scheduler: str | None = None,
           out: IO[str] | None = None, resume: bool = False, global_only: bool = False,
           join: bool = False) -> LaunchResult:
    """Plan, start and watch a job; returns its result (the caller prints the summary). Whatever a process would
    refuse at its start is refused here, before any starts (config.preflight)."""
    topology = job_topology(topology_path, os.environ)  # as every process will build it
    check_plugins(topology.training, topology)  # a bad sync name or plug-in option
    check_training(topology.training, topology.hfa, synchronous=SYNCHRONOUS,
                   applies_on_server=SYNC_POLICIES[topology.training.sync].needs_server_optimizer)  # e.g. HFA + async
    check_start(topology, command, os.environ, party=party, resume=resume, global_scheduler=global_scheduler,
                global_only=global_only)
    run_dir = run_dir or default_run_dir(topology_path)
    used = [] if resume or global_only or party is not None else earlier_job(run_dir)  # (a party joins a job's folder)
    if used:
        raise ValueError(f"run folder {run_dir} holds an earlier job's {' and '.join(used)}: a new job there would add "
                         "its counts to theirs; continue that job with --resume, or give another --run-dir")
    grace = topology.timeouts.shutdown_s + 10.0
    starts_tier = global_only or (party in (None, topology.central) and not join)  # in use: named first
    claimed = claim(global_scheduler, "the global scheduler") if global_scheduler and starts_tier else None
    # held for the whole job: no other job can take a scheduler's port, or the status page's
    with PortReservations(host) as ports, PortReservations(job_status(topology, os.environ).host) as page_ports, \
            contextlib.closing(claimed) if claimed else contextlib.nullcontext():
        specs = plan_processes(topology, topology_path, command, run_dir, host=host, ports=ports,
                               global_scheduler=global_scheduler, parties=[party] if party else None,
                               resume=resume, global_only=global_only, join=join)
        status_url = reserve_status_page(topology, specs, host, page_ports)
        check_processes(process_env(spec) for spec in specs)
        check_keys(topology, {spec.env["GEOMX_PARTY"] for spec in specs})  # a CURVE key file they need
        ended = threading.Event()
        if status_url is not None:
            announce_when_listening(status_url, out or sys.stdout, topology.timeouts.register_s, ended)
        if global_only:  # said once the scheduler's bind succeeded, not before
            address = next(s.env["GEOMX_GLOBAL_SCHEDULER"] for s in specs)
            announce_tier(address, f"[geomx launch] the global tier listens at {address}: start every party with "
                          f"GEOMX_GLOBAL_SCHEDULER={address} (or --party P --global-scheduler {address}; the "
                          "central one with --join too)", out or sys.stdout, topology.timeouts.register_s, ended)
        try:
            return Launcher(specs, run_dir, shutdown_grace_s=grace, out=out).run()
        finally:
            ended.set()
