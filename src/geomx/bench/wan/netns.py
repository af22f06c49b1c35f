"""A real, kernel-shaped WAN on one machine: two network namespaces joined by a veth pair with ``tbf``.

Each namespace stands for one data center. The veth pair carries real TCP between them; a ``tbf`` qdisc on
both ends limits each direction to ``rate_mbit`` (this kernel has no ``netem``, so no added delay: use
geomx's own emulator for latency). Everything is created under a per-run unique name (prefix + creator pid
+ random tag) and deleted on exit, also on Ctrl-C, SIGTERM or an exception; namespaces left by an earlier
run that crashed (its pid is gone) are deleted when the next link with the same prefix is built.

Each namespace has its own TCP congestion control (a per-namespace sysctl). By default it is what the host's is
when the namespaces are made (``Link.congestion()``); ``congestion="cubic"`` (or any of
``available_congestion()``) sets it in both, for every flow of every system run across the link. It moves the
bench's FSA rows by about a tenth (benchmarks/history.md, 2026-12-01).

Needs root and iproute2 (``ip``, ``tc``); :func:`unavailable_reason` says why not.

Usage::

    with wan_link(rate_mbit=100, congestion="cubic") as link:
        print(link.probe_mbit())                            # measured TCP throughput A -> B
        subprocess.run(link.exec_a(["python", "server.py", "--host", link.addr_a]))
        print(link.counters())                              # {"a_to_b": bytes, "b_to_a": bytes}
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_PREFIX = "gxw"
COMMAND_TIMEOUT_S = 20.0
CONGESTION_SYSCTL = "net.ipv4.tcp_congestion_control"
AVAILABLE_CONGESTION = "/proc/sys/net/ipv4/tcp_available_congestion_control"


class NetnsError(RuntimeError):
    """An ``ip``/``tc`` command failed; the message names the command and its error output."""


def unavailable_reason() -> str | None:
    """Why namespaces cannot be built here (not root, no ``ip``/``tc``, no netns support), or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces and tc qdiscs); run as root to measure on a kernel-shaped link"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return f"needs iproute2: {', '.join(missing)} not found on PATH"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    if probe.returncode != 0:
        return f"`ip netns list` failed: {probe.stderr.strip()}"
    return None


def _run(argv: list[str], check: bool = True) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    if check and proc.returncode != 0:
        raise NetnsError(f"`{' '.join(argv)}` failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def list_namespaces() -> list[str]:
    """Names of every network namespace on the machine (``ip netns list``)."""
    return [line.split()[0] for line in _run(["ip", "netns", "list"]).splitlines() if line.strip()]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cleanup_leftovers(prefix: str = DEFAULT_PREFIX) -> list[str]:
    """Delete namespaces named ``<prefix><pid>x...`` whose creating process is gone; returns their names.

    A namespace lives until deleted, so a run killed with SIGKILL leaves its pair behind; its veth goes with it.
    """
    removed = []
    for name in list_namespaces():
        rest = name[len(prefix):] if name.startswith(prefix) else ""
        pid_text = rest.split("x", 1)[0]
        if pid_text.isdigit() and not _pid_alive(int(pid_text)):
            _run(["ip", "netns", "del", name], check=False)
            removed.append(name)
    return removed


def tbf_args(rate_mbit: float) -> list[str]:
    """``tc`` arguments of a token bucket at ``rate_mbit``: a burst of >= 4 ms of traffic (and >= 64 kB, one
    GSO segment), a queue of 100 ms (deep enough that TCP is not starved by tail drops)."""
    rate_bytes = rate_mbit * 1e6 / 8
    burst = max(64 * 1024, int(rate_bytes * 0.004))
    return ["tbf", "rate", f"{rate_mbit:g}mbit", "burst", str(burst), "latency", "100ms"]


@dataclass(frozen=True)
class Link:
    """Two namespaces ``ns_a``/``ns_b`` joined by veth ``dev_a``/``dev_b`` at ``addr_a``/``addr_b`` (a /30)."""

    ns_a: str
    ns_b: str
    dev_a: str
    dev_b: str
    addr_a: str
    addr_b: str
    rate_mbit: float | None

    @property
    def namespaces(self) -> tuple[str, str]:
        return self.ns_a, self.ns_b

    def exec_in(self, namespace: str, argv: list[str]) -> list[str]:
        """The command line that runs ``argv`` inside ``namespace`` (``ip netns exec`` execs it: same pid)."""
        return ["ip", "netns", "exec", namespace, *argv]

    def exec_a(self, argv: list[str]) -> list[str]:
        return self.exec_in(self.ns_a, argv)

    def exec_b(self, argv: list[str]) -> list[str]:
        return self.exec_in(self.ns_b, argv)

    def set_rate(self, rate_mbit: float | None) -> Link:
        """Shape both directions at ``rate_mbit`` (None: remove the shaping); returns the updated link."""
        for ns, dev in ((self.ns_a, self.dev_a), (self.ns_b, self.dev_b)):
            if rate_mbit is None:
                _run(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root"], check=False)
            else:
                _run(["ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root",
                      *tbf_args(rate_mbit)])
        return Link(self.ns_a, self.ns_b, self.dev_a, self.dev_b, self.addr_a, self.addr_b, rate_mbit)

    def congestion(self) -> str:
        """The TCP congestion control new flows get in the two namespaces (one name; both ends agree)."""
        names = {_run(self.exec_in(ns, ["sysctl", "-n", CONGESTION_SYSCTL])).strip() for ns in self.namespaces}
        if len(names) != 1:
            raise NetnsError(f"the two namespaces' {CONGESTION_SYSCTL} differ: {sorted(names)}")
        return names.pop()

    def set_congestion(self, name: str) -> None:
        """Give every new TCP flow in both namespaces congestion control ``name`` (one the kernel has)."""
        available = available_congestion()
        if name not in available:
            raise NetnsError(f"TCP congestion control {name!r} is not in this kernel's {AVAILABLE_CONGESTION}: "
                             f"{' '.join(available)}")
        for ns in self.namespaces:
            _run(self.exec_in(ns, ["sysctl", "-qw", f"{CONGESTION_SYSCTL}={name}"]))

    def qdisc_stats(self, namespace: str, dev: str) -> dict[str, Any]:
        """The root qdisc's counters of ``dev`` (``tc -s -j qdisc show``): bytes, packets, drops, ..."""
        raw = json.loads(_run(["ip", "netns", "exec", namespace, "tc", "-s", "-j", "qdisc", "show", "dev", dev])
                         or "[]")
        roots = [entry for entry in raw if entry.get("root")]
        if not roots:
            raise NetnsError(f"no root qdisc on {dev} in {namespace}")
        return dict(roots[0])

    def counters(self) -> dict[str, int]:
        """Bytes sent so far per direction, from each end's egress qdisc (A's egress is A -> B)."""
        a = self.qdisc_stats(self.ns_a, self.dev_a)
        b = self.qdisc_stats(self.ns_b, self.dev_b)
        return {"a_to_b": int(a["bytes"]), "b_to_a": int(b["bytes"]), "drops_a": int(a.get("drops", 0)),
                "drops_b": int(b.get("drops", 0))}

    def free_port(self, namespace: str, host: str) -> int:
        """A TCP port the OS says is free on ``host`` inside ``namespace`` (bound once, then released)."""
        return free_port_in(namespace, host)

    def probe_mbit(self, seconds: float = 2.0, reverse: bool = False) -> float:
        """Measured TCP goodput across the link in Mbit/s: a receiver in one namespace, a sender in the other.

        ``reverse``: B -> A instead of A -> B. The receiver times from its first byte to the sender's close.
        """
        recv_ns, send_ns, recv_addr = ((self.ns_a, self.ns_b, self.addr_a) if reverse
                                       else (self.ns_b, self.ns_a, self.addr_b))
        receiver = subprocess.Popen(self.exec_in(recv_ns, [sys.executable, "-m", "geomx.bench.wan.netns", "recv",
                                                           "--host", recv_addr]),
                                    stdout=subprocess.PIPE, text=True)
        try:
            assert receiver.stdout is not None
            port = int(receiver.stdout.readline().strip())  # the receiver prints its port once listening
            _run(self.exec_in(send_ns, [sys.executable, "-m", "geomx.bench.wan.netns", "send", "--host", recv_addr,
                                        "--port", str(port), "--seconds", str(seconds)]))
            out, _ = receiver.communicate(timeout=COMMAND_TIMEOUT_S)
            return float(json.loads(out)["mbit"])
        finally:
            if receiver.poll() is None:
                receiver.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):  # stuck in the kernel: leave it, never hang
                    receiver.wait(timeout=COMMAND_TIMEOUT_S)


def free_port_in(namespace: str | None, host: str) -> int:
    """A TCP port the OS says is free on ``host`` inside ``namespace`` (None: this one), for a server to bind."""
    code = f"import socket; s = socket.socket(); s.bind(({host!r}, 0)); print(s.getsockname()[1])"
    argv = [sys.executable, "-c", code]
    return int(_run(argv if namespace is None else ["ip", "netns", "exec", namespace, *argv]).strip())


def available_congestion() -> list[str]:
    """The TCP congestion controls this kernel offers (what ``Link.set_congestion`` accepts)."""
    return Path(AVAILABLE_CONGESTION).read_text().split()


def _unique_base(prefix: str) -> str:
    base = f"{prefix}{os.getpid()}x{secrets.token_hex(2)}"
    if len(base) + 2 > 15:  # interface names are at most 15 characters
        raise ValueError(f"prefix {prefix!r} too long for unique interface names (max 15 chars with pid)")
    return base


def create_link(prefix: str = DEFAULT_PREFIX, rate_mbit: float | None = None, congestion: str | None = None) -> Link:
    """Build the namespaces and the veth pair (shaped at ``rate_mbit`` if given; TCP congestion control
    ``congestion`` in both namespaces if given, else the host's). Caller must :func:`destroy`."""
    base = _unique_base(prefix)
    net = f"10.250.{secrets.randbelow(256)}"  # private addresses that exist only inside the two namespaces
    link = Link(f"{base}a", f"{base}b", f"{base}A", f"{base}B", f"{net}.1", f"{net}.2", None)
    try:
        for ns in link.namespaces:
            _run(["ip", "netns", "add", ns])
        _run(["ip", "link", "add", link.dev_a, "netns", link.ns_a, "type", "veth", "peer", "name", link.dev_b,
              "netns", link.ns_b])
        for ns, dev, addr in ((link.ns_a, link.dev_a, link.addr_a), (link.ns_b, link.dev_b, link.addr_b)):
            _run(["ip", "-n", ns, "addr", "add", f"{addr}/30", "dev", dev])
            _run(["ip", "-n", ns, "link", "set", dev, "up"])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
        if congestion is not None:
            link.set_congestion(congestion)
        return link.set_rate(rate_mbit) if rate_mbit is not None else link
    except BaseException:
        destroy(link)
        raise


def destroy(link: Link) -> None:
    """Delete both namespaces (their veth ends go with them). Safe to call twice or on a half-built link."""
    present = set(list_namespaces())
    for ns in link.namespaces:
        if ns in present:
            _run(["ip", "netns", "del", ns], check=False)


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM raises KeyboardInterrupt (as Ctrl-C does) so ``finally`` clauses run."""
    if not _is_main_thread():
        yield
        return

    def handler(_signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt("SIGTERM")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _is_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def wan_link(rate_mbit: float | None = None, prefix: str = DEFAULT_PREFIX,
             congestion: str | None = None) -> Iterator[Link]:
    """A fresh link for the block, deleted afterwards whatever happens (see the module docstring).

    The yielded ``Link`` is the one built; a ``set_rate`` inside the block returns an updated copy with the
    same names, and the teardown deletes those names.
    """
    reason = unavailable_reason()
    if reason:
        raise NetnsError(reason)
    cleanup_leftovers(prefix)
    with _sigterm_as_interrupt():
        link = create_link(prefix, rate_mbit, congestion)
        try:
            yield link
        finally:
            destroy(link)


# --- the throughput probe's two ends (run inside the namespaces as `python -m geomx.bench.wan.netns recv|send`) ---

def _receive(host: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind((host, 0))
        server.listen(1)
        server.settimeout(COMMAND_TIMEOUT_S)
        print(server.getsockname()[1], flush=True)
        conn, _ = server.accept()
        with conn:
            conn.settimeout(COMMAND_TIMEOUT_S)
            total, first = 0, None
            while chunk := conn.recv(1 << 20):
                first = first or time.perf_counter()
                total += len(chunk)
            elapsed = time.perf_counter() - (first or time.perf_counter())
    print(json.dumps({"bytes": total, "seconds": elapsed, "mbit": total * 8 / max(elapsed, 1e-9) / 1e6}))


def _send(host: str, port: int, seconds: float) -> None:
    block = b"\0" * (1 << 20)
    with socket.create_connection((host, port), timeout=COMMAND_TIMEOUT_S) as conn:
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            conn.sendall(block)


def main(argv: list[str] | None = None) -> int:
    """The probe's ends, and ``cleanup`` (delete leftovers of crashed runs):
    ``python -m geomx.bench.wan.netns cleanup``."""
    parser = argparse.ArgumentParser(prog="python -m geomx.bench.wan.netns")
    sub = parser.add_subparsers(dest="what", required=True)
    recv = sub.add_parser("recv")
    recv.add_argument("--host", required=True)
    send = sub.add_parser("send")
    send.add_argument("--host", required=True)
    send.add_argument("--port", type=int, required=True)
    send.add_argument("--seconds", type=float, default=2.0)
    clean = sub.add_parser("cleanup")
    clean.add_argument("--prefix", default=DEFAULT_PREFIX)
    args = parser.parse_args(argv)
    if args.what == "recv":
        _receive(args.host)
    elif args.what == "send":
        _send(args.host, args.port, args.seconds)
    else:
        print("\n".join(cleanup_leftovers(args.prefix)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
