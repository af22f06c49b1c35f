"""Warm workers: the integration jobs' worker processes forked from one that has imported torch already.

Why: a job's processes start in a few seconds of CPU each, nearly all of it ``import torch`` (~1.5 CPU-s) and
``torch._dynamo`` (~1.5 CPU-s more, which ``torch.optim`` imports on a first ``add_param_group``); the jobs
themselves train for a fraction of that. The suite starts ~600 workers on a 2-core machine, so most of its
minutes went to imports. This server imports them once (per pytest process) and forks each worker from that
state: each is still a process of its own, started by the launcher (through ``warm_stub.py``), running the
script as ``__main__`` with its own environment, folder, stdio and process group, talking over real sockets.

What differs from ``python script.py``: the worker is the stub's stand-in, not the launcher's child, so what
finds processes by ``/proc/<pid>/environ`` (``geomx.launch.job_processes``) sees the stub, and SIGSTOP to the stub
does not stop the worker; a network namespace the stub runs in is not the worker's. Tests that need those mark
their module ``pytest.mark.cold_workers`` (``conftest.py``); ``TESTS_COLD_WORKERS=1`` makes every worker cold.

Usage (``conftest.py``'s session fixture does this)::

    with WarmWorkers(tmp_path / "warm.sock") as warm:   # then harness.worker_command(...) goes through warm_stub
        ...
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import runpy
import select
import selectors
import signal
import socket
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

# what every worker script here imports; a module missing from this environment is skipped
PRELOAD = ("numpy", "yaml", "zmq", "torch", "torch.nn.functional", "torch.distributed", "torch._dynamo",
           "torch.distributed.fsdp", "geomx.kv", "geomx.optim", "geomx.torch", "geomx.zoo")
READY = "warm workers ready"
START_TIMEOUT_S = 180.0  # the imports take ~4 CPU-s; a loaded CI machine stretches that many times
REQUEST_TIMEOUT_S = 10.0


def _read_request(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """The stub's request (argv, env, cwd) and its stdin/stdout/stderr, as it sent them (``warm_stub.py``)."""
    conn.settimeout(REQUEST_TIMEOUT_S)
    header, fds, _, _ = socket.recv_fds(conn, 4, 3)
    if len(header) != 4 or len(fds) != 3:
        for fd in fds:
            os.close(fd)
        raise ConnectionError(f"a request without its header or its three descriptors ({len(fds)})")
    size, = struct.unpack("!I", header)
    body = bytearray()
    while len(body) < size:
        chunk = conn.recv(size - len(body))
        if not chunk:
            raise ConnectionError("the stub closed its request half-way")
        body += chunk
    conn.settimeout(None)
    return json.loads(body), fds


class Server:
    """Forks a worker per stub, reports each one's end to its stub, SIGKILLs a worker whose stub is gone."""

    def __init__(self, listener: socket.socket) -> None:
        self.listener = listener
        self.selector = selectors.DefaultSelector()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        self.children: dict[int, socket.socket] = {}

    def serve(self) -> tuple[dict[str, Any], list[int]]:
        """Run until SIGTERM (then exit); returns only in a forked child, with its request and descriptors."""
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, self._end)
        signal.signal(signal.SIGINT, self._end)
        self.selector.register(self.listener, selectors.EVENT_READ)
        self.selector.register(self.wake_r, selectors.EVENT_READ)
        while True:
            for key, _ in self.selector.select():
                if key.fileobj is self.listener:
                    forked = self._accept()
                    if forked is not None:
                        return forked
                elif key.fileobj == self.wake_r:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self.wake_r, 4096)
                else:
                    self._stub_spoke(key.fileobj)  # type: ignore[arg-type]
            self._reap()

    def _accept(self) -> tuple[dict[str, Any], list[int]] | None:
        conn, _ = self.listener.accept()
        try:
            request, fds = _read_request(conn)
        except (OSError, ValueError) as exc:
            sys.stderr.write(f"warm workers: a bad request: {exc}\n")
            conn.close()
            return None
        pid = os.fork()
        if pid == 0:
            self._leave(conn)
            return request, fds
        for fd in fds:
            os.close(fd)
        self.children[pid] = conn
        self.selector.register(conn, selectors.EVENT_READ)
        with contextlib.suppress(OSError):
            conn.sendall(f"pid {pid}\n".encode())
        return None

    def _leave(self, conn: socket.socket) -> None:
        """In a new child: drop everything of the server's."""
        signal.set_wakeup_fd(-1)
        self.selector.close()
        for fd in (self.wake_r, self.wake_w):
            os.close(fd)
        for sock in (self.listener, conn, *self.children.values()):
            sock.close()
        self.children.clear()

    def _stub_spoke(self, conn: socket.socket) -> None:
        """A stub says nothing after its request: readable means it is gone; its worker goes too."""
        with contextlib.suppress(OSError):
            if conn.recv(64):
                return
        self.selector.unregister(conn)
        for pid, owner in list(self.children.items()):
            if owner is conn:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is None:
                continue
            code = os.waitstatus_to_exitcode(status)
            end = f"signal {-code}" if code < 0 else f"exit {code}"
            with contextlib.suppress(OSError):
                conn.sendall(f"{end}\n".encode())
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(conn)
            conn.close()

    def _end(self, _signum: int, _frame: object) -> None:
        for pid in self.children:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        os._exit(0)


def become(request: dict[str, Any], fds: list[int]) -> str:
    """Make this forked child what ``python script.py args`` with the stub's environment would be; returns the
    script's path."""
    os.setpgid(0, 0)  # a group of its own: the stub forwards the launcher's signals to it
    with contextlib.suppress(OSError, AttributeError):  # the server gone (pytest killed): so is the worker
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    for signum in (signal.SIGCHLD, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    script = os.path.abspath(request["argv"][0])
    extra = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    sys.path[:1] = [os.path.dirname(script), *[entry for entry in extra if entry not in sys.path]]
    sys.argv = [request["argv"][0], *request["argv"][1:]]
    import numpy as np
    import torch

    np.random.seed()  # a fresh process seeds numpy's global generator from the OS; a fork would share the server's
    if "OMP_NUM_THREADS" in os.environ:  # read when torch loaded: here, in the server, without this worker's value
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    return script


def main() -> None:
    path = Path(sys.argv[1])
    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    gc.collect()
    gc.freeze()  # the forks' collections leave these objects (and their pages) alone
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(64)
    print(READY, flush=True)
    request, fds = Server(listener).serve()
    script = become(request, fds)
    del request, fds
    runpy.run_path(script, run_name="__main__")


class WarmWorkers:
    """Starts the server (``python warm_workers.py SOCKET``) and stops it; ``socket_path`` is what stubs take.

    ``ensure()`` starts it again where it has died: ``geomx bench``'s ``StopOnSignals`` ends every process below
    the one it runs in, and a test runs it in the pytest process, this server's parent."""

    def __init__(self, socket_path: Path) -> None:
        self.socket_path = socket_path
        self.proc: subprocess.Popen[str] | None = None

    def ensure(self) -> Path:
        """The socket of a running server (started now if there is none); RuntimeError if it does not start."""
        if self.proc is not None and self.proc.poll() is None:
            return self.socket_path
        from geomx.cluster.processes import die_with_parent
        from geomx.launch import PROCESS_DEFAULTS

        self.socket_path.unlink(missing_ok=True)
        # as the launcher starts every process: glibc reads MALLOC_* when a process starts, not when it forks
        env = {**PROCESS_DEFAULTS, **os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen([sys.executable, __file__, str(self.socket_path)], env=env, text=True,
                                     stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, preexec_fn=die_with_parent())
        assert self.proc.stdout is not None
        # the server prints READY after its imports, or dies (an empty line)
        ready, _, _ = select.select([self.proc.stdout], [], [], START_TIMEOUT_S)
        line = self.proc.stdout.readline() if ready else f"nothing within {START_TIMEOUT_S:g} s"
        if line.strip() != READY:
            self.close()
            raise RuntimeError(f"the warm-worker server did not start: {line!r}")
        return self.socket_path

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
        self.socket_path.unlink(missing_ok=True)

    def __enter__(self) -> WarmWorkers:
        self.ensure()
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


if __name__ == "__main__":
    main()
