"""Ports for a job's schedulers: picked below the kernel's ephemeral range and held until the scheduler binds.

Usage::

    with PortReservations("127.0.0.1") as ports:
        scheduler = f"127.0.0.1:{ports.take()}"
    free_port("127.0.0.1")                      # one port, released at once (a caller that cannot hold it)
    pick = distinct_free_ports("127.0.0.1")     # several such ports, never the same one twice
"""

from __future__ import annotations

import contextlib
import random
import socket
from collections.abc import Callable
from pathlib import Path


def _ephemeral_low() -> int:
    """The lowest port the kernel hands out for bind(0) and outgoing connections (Linux; the usual default else)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


class PortReservations:
    """Ports picked for this job's schedulers, each held by a bound, never listening socket until closed.

    A port that is picked, released and bound later by the scheduler can be taken by anyone in between (seen
    with two test suites at once: a scheduler exited with "Address already in use"). Held here instead, any
    other pick (a plain bind, as :meth:`take` does) is refused the port, while the scheduler's own bind
    succeeds: ZeroMQ sets SO_REUSEADDR, and Linux lets sockets that all set it share a port as long as at most
    one of them listens. Ports are picked below the kernel's ephemeral range: a port from bind(0) lies *in*
    that range, where any process's outgoing connection may take it. Falls back to bind(0) if the low ports
    are all taken.

    Usage::

        with PortReservations("127.0.0.1") as ports:
            scheduler = f"127.0.0.1:{ports.take()}"
            ...  # start the scheduler and run the job; the port is released at the end
    """

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self._held: list[socket.socket] = []

    def take(self) -> int:
        """A port nobody else holds, reserved until :meth:`close`."""
        low = _ephemeral_low()
        pick = random.SystemRandom()
        for port in [pick.randrange(10_000, low) for _ in range(64)] if low > 11_000 else []:
            with contextlib.suppress(OSError):
                return self._hold(port)
        return self._hold(0)

    def hold(self, port: int) -> int:
        """``port`` itself, reserved until :meth:`close`; OSError if anyone else holds or uses it."""
        return self._hold(port)

    def _hold(self, port: int) -> int:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind((self.host, port))  # without SO_REUSEADDR: refused if anyone holds or uses the port
        except OSError:
            sock.close()
            raise
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # after the bind: lets the scheduler bind
        self._held.append(sock)
        return int(sock.getsockname()[1])

    def close(self) -> None:
        """Release every held port (a scheduler already listening on one keeps it)."""
        for sock in self._held:
            sock.close()
        self._held.clear()

    def __enter__(self) -> PortReservations:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port the OS says is free now, released at once: for a caller that cannot hold it.

    Prefer :class:`PortReservations` where the caller lives as long as the process that will bind the port.
    """
    with PortReservations(host) as ports:
        return ports.take()


def distinct_free_ports(host: str = "127.0.0.1") -> Callable[[], int]:
    """A picker of free ports released at once (:func:`free_port`) that never gives the same port twice.

    A job's plan picks a port per scheduler before any of them binds: released at once, the same port can come
    up again for the next scheduler (seen in CI: a party's scheduler exited with "Address already in use" on the
    global scheduler's port). Usage: ``pick = distinct_free_ports(); first, second = pick(), pick()``
    """
    given: set[int] = set()

    def pick() -> int:
        port = free_port(host)
        while port in given:
            port = free_port(host)
        given.add(port)
        return port

    return pick
