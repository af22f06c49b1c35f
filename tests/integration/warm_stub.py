"""The launcher's view of a warm worker: ``python warm_stub.py SOCKET script.py args...`` (stdlib only, ~20 ms).

It asks the warm-worker server at SOCKET (``warm_workers.py``) to fork ``script.py args`` with this process's
environment, working folder and stdin/stdout/stderr, then stands for that worker: each signal it gets (the
launcher's SIGINT, SIGTERM, SIGCONT; the SIGTERM of ``die_with_parent``) goes on to the worker's process group,
and it ends as the worker did, with its exit code or by its signal. If this stub is SIGKILLed the server sees the
connection close and SIGKILLs the worker. Usage (``harness.worker_command`` writes it)::

    python warm_stub.py /tmp/.../warm.sock tests/integration/workers/train.py --steps 3
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import struct
import sys

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGCONT, signal.SIGUSR1,
             signal.SIGUSR2)


def main() -> None:
    path, argv = sys.argv[1], sys.argv[2:]
    pending: list[int] = []
    worker: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        if not worker:
            pending.append(signum)
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker[0], signum)

    for signum in FORWARDED:
        signal.signal(signum, forward)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(path)
    request = json.dumps({"argv": argv, "env": dict(os.environ), "cwd": os.getcwd()}).encode()
    socket.send_fds(conn, [struct.pack("!I", len(request))], [0, 1, 2])
    conn.sendall(request)
    reader = conn.makefile("r")
    line = reader.readline().split()
    if len(line) != 2 or line[0] != "pid":
        sys.stderr.write(f"warm_stub: the warm-worker server at {path} did not start {argv[0]}: {line}\n")
        sys.exit(70)
    worker.append(int(line[1]))
    for signum in pending:
        forward(signum, None)
    how, _, value = reader.readline().strip().partition(" ")
    if how == "signal":
        signum = int(value)
        if signum != signal.SIGKILL:
            signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
        os.kill(os.getpid(), signum)
    sys.exit(int(value) if how == "exit" else 70)


if __name__ == "__main__":
    main()
