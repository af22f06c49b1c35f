"""A scheduler's address as the launcher sees it: claimed before any process starts, announced once it listens.

Why: `geomx launch --global-scheduler HOST:PORT` (the central party, or ``--global-only``) names a port the global
scheduler will bind. If another process listens there, the scheduler's bind fails after the launcher has started
everything; claimed here first, the port in use is one line before any process starts. And the launcher's
"the global tier listens at ..." line must follow the scheduler's bind, not precede it: it waits until a socket
listens at the port (read from /proc/net/tcp, which no connection attempt disturbs: a probe would be logged by a
secured scheduler as a refused handshake).

Usage::

    held = claim(address, "the global scheduler")     # ConfigError if something listens there; close() later
    announce_when_listening(address, "[geomx launch] the global tier listens at ...", out, 60, ended)
"""

from __future__ import annotations

import errno
import socket
import threading
from pathlib import Path
from typing import IO

from ..config import ConfigError

_LISTEN = "0A"  # the TCP state LISTEN in /proc/net/tcp
POLL_S = 0.05


def claim(address: str, what: str) -> socket.socket:
    """Bind ``address`` (HOST:PORT) as a ZeroMQ socket will (SO_REUSEADDR: only a socket listening there refuses,
    not one that merely holds the port or a closed connection's TIME_WAIT) and hold it, never listening, until
    the caller closes it. ConfigError naming ``what``, the address and the cause if it cannot be bound."""
    host, _, port = address.rpartition(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, int(port)))
    except (OSError, ValueError) as exc:
        sock.close()
        cause = getattr(exc, "strerror", None) or str(exc)
        hint = (" (is another job, or an old process of this one, still running there? pick another port)"
                if getattr(exc, "errno", None) == errno.EADDRINUSE else "")
        raise ConfigError(f"{what} cannot listen at {address}: {cause}{hint}") from None
    return sock


def listening(port: int, tables: tuple[Path, ...] = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))) -> bool | None:
    """Whether a socket of this host (network namespace) listens at TCP ``port``; None where /proc cannot say."""
    found = False
    for table in tables:
        try:
            rows = table.read_text().splitlines()[1:]
        except OSError:
            continue
        found = True
        for row in rows:
            fields = row.split()
            if len(fields) > 3 and fields[3] == _LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                return True
    return False if found else None


def announce_when_listening(address: str, text: str, out: IO[str], timeout: float,
                            ended: threading.Event) -> threading.Thread:
    """Print ``text`` once a socket listens at ``address``'s port (the scheduler's bind succeeded), from a daemon
    thread that gives up silently after ``timeout`` or when the job has ``ended`` (the scheduler says why it
    could not bind). Where /proc cannot tell, ``text`` is printed at once."""
    port = int(address.rpartition(":")[2])

    def wait() -> None:
        waited = 0.0
        while waited < timeout and not ended.is_set():
            state = listening(port)
            if state is None or state:
                out.write(text + "\n")
                out.flush()
                return
            ended.wait(POLL_S)
            waited += POLL_S

    thread = threading.Thread(target=wait, name="geomx-tier-announce", daemon=True)
    thread.start()
    return thread
