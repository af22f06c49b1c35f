"""The OS processes of a job, as a launcher sees them: the tree below it, how to end it, and signals that stop a
command running several jobs (``geomx bench``). Linux ``/proc`` and ``prctl``; elsewhere the tree is empty.

Why: a process group reaches only the processes that stayed in it; a rank that torchrun or a user's script started
in a session of its own does not, and once its parent is gone its parent pid no longer leads to the launcher. So
the launcher notes the tree as the job runs (``descendants``) and signals each process it noted (``signal_tree``,
checked against its start time so that a reused pid is never hit).

Usage::

    tree = descendants([proc.pid])
    left = end_tree(tree, grace=5.0)          # SIGTERM, SIGKILL after 5 s; the pids stuck in the kernel
    with StopOnSignals() as stop: ...         # SIGINT/SIGTERM raise KeyboardInterrupt; leftovers ended at the end
    subprocess.Popen(argv, preexec_fn=die_with_parent())   # SIGTERM to the child if this process is SIGKILLed
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

KILL_WAIT_S = 10.0  # how long to wait for a SIGKILLed process to be reaped before reporting it and going on
STOP_GRACE_S = 5.0  # after SIGTERM, how long a process may take before SIGKILL


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (state first), None once the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def alive(pid: int, started: str | None = None) -> bool:
    """True while ``pid`` runs (a zombie has ended); with ``started`` (its start time), only that same process."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X") and (started is None or fields[19] == started)


def descendants(pids: list[int]) -> dict[int, str]:
    """Every live process below ``pids`` (children, grandchildren, ..., whatever their session or process group),
    pid -> start time (to tell it from a later process given the same pid). Linux /proc; empty elsewhere.

    Why: a process group reaches only the processes that stayed in it; a rank that torchrun or a user's script
    started in a session of its own does not, and once its parent is gone its parent pid no longer leads here.
    Take the snapshot before stopping anything. Usage: ``tree = descendants([proc.pid])``.
    """
    children: dict[int, list[int]] = {}
    starts: dict[int, str] = {}
    with contextlib.suppress(OSError):
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            fields = _stat_fields(int(entry.name))
            if fields is None or fields[0] in ("Z", "X"):
                continue
            children.setdefault(int(fields[1]), []).append(int(entry.name))
            starts[int(entry.name)] = fields[19]
    found: dict[int, str] = {}
    todo = list(pids)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found[child] = starts[child]
                todo.append(child)
    return found


def signal_tree(tree: dict[int, str], sig: int) -> None:
    """Send ``sig`` to every process of a ``descendants`` snapshot that is still the same process."""
    for pid, started in tree.items():
        if alive(pid, started):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)


def end_tree(tree: dict[int, str], grace: float) -> list[int]:
    """SIGTERM (and SIGCONT) every process of ``tree``, SIGKILL what is left after ``grace``; returns the pids still
    running after the SIGKILL and ``KILL_WAIT_S`` more (stuck in the kernel), which are left."""
    signal_tree(tree, signal.SIGTERM)
    signal_tree(tree, signal.SIGCONT)
    for wait_s, sig in ((grace, signal.SIGKILL), (KILL_WAIT_S, None)):
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and any(alive(p, s) for p, s in tree.items()):
            time.sleep(0.05)
        if sig is not None:
            signal_tree(tree, sig)
    return [pid for pid, started in tree.items() if alive(pid, started)]


class StopOnSignals:
    """For a command that runs several jobs (``geomx bench``): SIGINT and SIGTERM stop the whole command.

    Inside the block, either signal raises KeyboardInterrupt in the main thread (``signum`` says which); a
    ``Launcher`` running a job at that moment stops its job first, then passes the signal on to this handler, so
    the command never goes on to its next job. The process becomes a child subreaper (Linux), so processes
    orphaned below it stay its descendants; on leaving the block, every descendant still running is ended
    (SIGTERM, then SIGKILL after ``grace`` seconds) and reaped: nothing the command started outlives it.

    Usage::

        with StopOnSignals() as stop:
            try:
                for job in jobs: run(job)
            except KeyboardInterrupt:
                print(f"stopped by signal {stop.signum}; writing what was measured")
    """

    def __init__(self, grace: float = STOP_GRACE_S) -> None:
        self.grace = grace
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}
        self._was_subreaper = False

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self.signum = signum
        raise KeyboardInterrupt

    def __enter__(self) -> StopOnSignals:
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        self._was_subreaper = _subreaper(True)
        return self

    def ignore(self) -> None:
        """From now on until the block ends, SIGINT and SIGTERM are ignored: the command is writing its results."""
        for sig in self._previous:
            signal.signal(sig, signal.SIG_IGN)

    def __exit__(self, *_exc: object) -> None:
        self.ignore()  # a second signal while the leftovers are ended is ignored: the block already stopped
        try:
            tree = descendants([os.getpid()])
            if tree:
                left = end_tree(tree, self.grace)
                if left:
                    sys.stderr.write(f"[geomx] pids {left} did not exit after SIGKILL; leaving them\n")
            _reap_adopted(tree)
        finally:
            _subreaper(self._was_subreaper)
            for sig, handler in self._previous.items():
                signal.signal(sig, handler)


def _subreaper(on: bool) -> bool:
    """prctl(PR_SET_CHILD_SUBREAPER): while on, orphaned descendants are re-parented to this process, not to init
    (Linux; elsewhere nothing). Returns whether it was on before."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        was = ctypes.c_int(0)
        libc.prctl(37, ctypes.byref(was), 0, 0, 0)  # PR_GET_CHILD_SUBREAPER
        libc.prctl(36, int(on), 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
        return bool(was.value)
    except (OSError, AttributeError):
        return False


def _reap_adopted(tree: dict[int, str]) -> None:
    """Collect the exit status of every ended process of ``tree`` that is this process's child now (adopted as the
    subreaper, or started here and abandoned), so none is left a zombie."""
    for pid in tree:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` for ``subprocess.Popen``: the child gets SIGTERM when this process dies, even by SIGKILL,
    which no handler sees (``prctl(PR_SET_PDEATHSIG)``, Linux; None elsewhere). Made before the fork: the child
    only calls a bound C function, no Python import or lock. A node writes its counters on that SIGTERM and ends
    (``geomx.node``); a user's worker ends.

    Usage: ``subprocess.Popen(argv, start_new_session=True, preexec_fn=die_with_parent())``.
    """
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def arm() -> None:
        prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before the line above: nobody would send the signal
            os._exit(143)

    return arm


def job_processes(run_dirs: set[str]) -> dict[int, dict[str, str]]:
    """pid -> the GEOMX_* environment of every live process launched into one of ``run_dirs`` (Linux /proc).

    How fault injection, the fuzzer and the soak find a job's processes (e.g. to SIGKILL a party).
    Usage: ``[pid for pid, env in job_processes({str(run_dir)}).items() if env["GEOMX_PARTY"] == "dc1"]``.
    """
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            pairs = (item.split("=", 1) for item in (entry / "environ").read_text().split("\0") if "=" in item)
            env = {key: value for key, value in pairs if key.startswith("GEOMX_")}
        except (OSError, UnicodeDecodeError):
            continue
        if env.get("GEOMX_RUN_DIR") in run_dirs:
            found[int(entry.name)] = env
    return found
