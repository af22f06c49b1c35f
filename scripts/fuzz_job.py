"""Spray random and mutated frames at every port of a live geomx job, then check that it still finishes.

The script starts the job itself (like ``geomx launch``), finds every TCP port its processes listen on
(from ``/proc``: schedulers, servers and workers all bind one), and sends ``--frames`` frame lists to them
round-robin from DEALER sockets: pure noise, and valid messages of every kind mutated (bytes flipped,
frames cut, grown, dropped, duplicated or swapped, header words replaced by huge values). It sends them
twice over when the topology has a shared secret: once without it (every connection must be refused in
the handshake) and once with it (the frames reach the decoders, which must drop them). Then it waits for
the job and prints what the master worker last recorded (e.g. its test accuracy).

Usage::

    python scripts/fuzz_job.py topologies/demo.yaml --frames 100000 -- python examples/cnn.py --epochs 4
    python scripts/fuzz_job.py secure.yaml --frames 100000 --out fuzz.json -- python examples/cnn.py

Exit code 0 if the job succeeded (every process exited 0), 1 otherwise.
"""

from __future__ import annotations

import argparse
import io
import json
import random
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import zmq

from geomx.algorithms.registry import MESSAGE_KINDS
from geomx.config import SecuritySpec, Topology, load_topology
from geomx.launch import Launcher, LaunchResult, PortReservations, default_run_dir, format_summary, plan_processes
from geomx.protocol.wire import Flag, Kind, Message, encode
from geomx.transport.security import PLAIN_USER

_SOCKET = re.compile(r"socket:\[(\d+)\]")


def listening_ports(pid: int) -> set[int]:
    """TCP ports process ``pid`` listens on (its socket inodes matched against /proc/net/tcp)."""
    inodes = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                match = _SOCKET.fullmatch(str(fd.readlink()))
            except OSError:
                continue
            if match:
                inodes.add(match.group(1))
    except OSError:
        return set()
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def templates(rng: random.Random) -> list[list[bytes]]:
    """Valid messages of every kind, the algorithms' own included (requests and replies), with and without tensors
    and bodies."""
    out = []
    for kind in [*Kind, *MESSAGE_KINDS]:
        for _ in range(3):
            tensor = None
            if rng.random() < 0.5:
                tensor = np.frombuffer(rng.randbytes(4 * rng.randrange(0, 64)), dtype=np.float32).copy()
            body = rng.choice([None, {}, {"optimizer": {"name": "sgd", "params": {"lr": 1e9}}},
                               {"role": "worker", "party": "dc0", "address": "tcp://127.0.0.1:1"},
                               {"error": "x"}, {"sync": "dist_async"}, {"seconds_per_step": {"w": 1}, "base_steps": 1},
                               {"dead": {"x": "y"}}])
            flags = rng.choice([Flag.NONE, Flag.REPLY])
            parts = None
            if kind is Kind.BUNDLE:  # a bundle of PUSHPULLs (or their answers), each a slice's round
                parts = [Message(Kind.PUSHPULL, key=rng.randrange(0, 16), slice=0, num_slices=1,
                                 request_id=rng.randrange(0, 2**64), flags=flags,
                                 tensor=np.frombuffer(rng.randbytes(4 * rng.randrange(1, 16)), dtype=np.float32))
                         for _ in range(rng.randrange(1, 4))]
                tensor, body = None, None
            message = Message(kind, key=rng.randrange(0, 16), request_id=rng.randrange(0, 2**64),
                              flags=flags, tensor=tensor, body=body, parts=parts)
            out.append([bytes(memoryview(f)) for f in encode(message)])
    return out


def mutate(frames: list[bytes], rng: random.Random) -> list[bytes]:
    frames = list(frames)
    for _ in range(rng.randrange(1, 4)):
        how = rng.randrange(7)
        index = rng.randrange(len(frames)) if frames else 0
        if how == 0 and frames and frames[index]:
            data = bytearray(frames[index])
            for _ in range(rng.randrange(1, 5)):
                data[rng.randrange(len(data))] = rng.randrange(256)
            frames[index] = bytes(data)
        elif how == 1 and frames:
            frames[index] = frames[index][:rng.randrange(len(frames[index]) + 1)]
        elif how == 2 and frames:
            frames[index] += rng.randbytes(rng.randrange(1, 64))
        elif how == 3 and len(frames) > 1:
            del frames[index]
        elif how == 4 and frames:
            frames.insert(index, frames[index])
        elif how == 5 and frames and len(frames[0]) >= 8:
            header = bytearray(frames[0])
            offset = rng.randrange(0, len(header) - 7)
            header[offset:offset + 8] = rng.choice([b"\xff" * 8, (1 << 40).to_bytes(8, "little"), rng.randbytes(8)])
            frames[0] = bytes(header)
        else:
            frames.reverse()
    return frames


def junk(count: int, seed: int) -> list[list[bytes]]:
    """``count`` frame lists: a quarter pure noise, the rest mutated valid messages."""
    rng = random.Random(seed)
    base = templates(rng)
    out = []
    for _ in range(count):
        if rng.random() < 0.25:
            out.append([rng.randbytes(rng.randrange(0, 200)) for _ in range(rng.randrange(1, 5))])
        else:
            out.append(mutate(rng.choice(base), rng))
    return out


@dataclass
class SprayReport:
    with_secret: bool
    frames: int = 0  # handed to ZeroMQ
    unsendable: int = 0  # refused: the connection to that port was closed by the handshake (no pipe to queue on)
    bytes: int = 0
    seconds: float = 0.0
    by_port: dict[int, int] = field(default_factory=dict)


def spray(ports: list[int], frames: list[list[bytes]], security: SecuritySpec | None, host: str = "127.0.0.1",
          linger_s: float = 10.0) -> SprayReport:
    """Send ``frames`` round-robin to ``ports``; with ``security`` as a client that knows the shared secret."""
    context = zmq.Context()
    report = SprayReport(with_secret=security is not None)
    sockets = []
    for port in ports:
        sock = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, int(linger_s * 1000))
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.IMMEDIATE, 0)
        if security is not None and security.secret is not None:
            sock.setsockopt(zmq.PLAIN_USERNAME, PLAIN_USER)
            sock.setsockopt(zmq.PLAIN_PASSWORD, security.secret.encode())
        sock.connect(f"tcp://{host}:{port}")
        sockets.append(sock)
    started = time.monotonic()
    for index, message in enumerate(frames):
        target = index % len(sockets)
        try:
            sockets[target].send_multipart(message, flags=zmq.NOBLOCK)
        except zmq.Again:
            report.unsendable += 1
            continue
        report.frames += 1
        report.bytes += sum(len(f) for f in message)
        report.by_port[ports[target]] = report.by_port.get(ports[target], 0) + 1
    for sock in sockets:
        sock.close()
    context.term()  # returns when every frame left (or the linger ran out: refused connections never drain)
    report.seconds = time.monotonic() - started
    return report


class LiveJob:
    """A job started in a background thread, with its processes' pids and listening ports.

    Usage::

        job = LiveJob(topology_path, ["python", "train.py"], run_dir)
        ports = job.wait_for_ports(timeout=60)
        ...
        result = job.wait(timeout=600)
    """

    def __init__(self, topology_path: Path, command: list[str], run_dir: Path, resume: bool = False) -> None:
        self.topology: Topology = load_topology(topology_path)
        self._ports = PortReservations()  # the schedulers' ports, held until the job ends (geomx.cluster.ports)
        specs = plan_processes(self.topology, topology_path, command, run_dir, resume=resume, ports=self._ports)
        self.output = io.StringIO()
        self.launcher = Launcher(specs, run_dir, shutdown_grace_s=self.topology.timeouts.shutdown_s + 10,
                                 out=self.output)
        self.result: LaunchResult | None = None
        self._thread = threading.Thread(target=self._run, name="fuzz-job", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.result = self.launcher.run()
        finally:
            self._ports.close()

    def wait_for_ports(self, timeout: float) -> dict[str, set[int]]:
        """Process label -> its listening ports, once every process of the job listens on one."""
        deadline = time.monotonic() + timeout
        expected = len(self.launcher.specs)
        while time.monotonic() < deadline:
            found = {label: listening_ports(pid) for label, pid in self.launcher.pids().items()}
            if len(found) == expected and all(found.values()):
                return found
            if self.result is not None:
                raise RuntimeError(f"the job ended before all its ports were open:\n{self.output.getvalue()[-3000:]}")
            time.sleep(0.05)
        raise TimeoutError(f"not every process listened within {timeout:g} s")

    def wait(self, timeout: float) -> LaunchResult:
        self._thread.join(timeout)
        if self.result is None:
            raise TimeoutError(f"the job did not finish within {timeout:g} s")
        return self.result


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in argv:
        split = argv.index("--")
        argv, command = argv[:split], argv[split + 1:]
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("topology")
    parser.add_argument("--frames", type=int, default=100_000, help="frame lists per pass (default 100000)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--run-dir")
    parser.add_argument("--out", help="write the report as JSON here")
    parser.add_argument("--timeout", type=float, default=1800.0, help="give up on the job after this long")
    args = parser.parse_args(argv)
    if not command:
        parser.error("give the worker command after '--'")
    topology_path = Path(args.topology)
    run_dir = Path(args.run_dir) if args.run_dir else default_run_dir(topology_path)
    job = LiveJob(topology_path, command, run_dir)
    try:
        ports_by_process = job.wait_for_ports(timeout=job.topology.timeouts.register_s)
        ports = sorted(p for found in ports_by_process.values() for p in found)
        print(f"[fuzz] {len(ports)} ports of {len(ports_by_process)} processes: {ports}", flush=True)
        security = job.topology.security
        passes: list[SecuritySpec | None] = [None]
        if security.secret is not None:
            passes.append(security)  # without the secret first, then with it
        reports = []
        for index, credentials in enumerate(passes):
            # refused connections never drain: do not linger on them
            report = spray(ports, junk(args.frames, args.seed + index), credentials,
                           linger_s=10.0 if credentials else 1.0)
            reports.append(report)
            print(f"[fuzz] sent {report.frames} frame lists ({report.bytes / 1e6:.1f} MB; {report.unsendable} more "
                  f"could not be queued: connection refused) "
                  f"{'with' if report.with_secret else 'without'} the secret in {report.seconds:.1f} s", flush=True)
        result = job.wait(args.timeout)
    except BaseException:
        job.launcher.stop()  # never leave the job's processes behind
        raise
    print(job.output.getvalue()[-4000:])
    print(format_summary(result))
    if args.out:
        Path(args.out).write_text(json.dumps({
            "ports": {label: sorted(found) for label, found in ports_by_process.items()},
            "passes": [vars(r) for r in reports], "exit_code": result.exit_code, "failed": result.failed,
            "summary": result.summary}, indent=1, default=str))
    return 0 if result.exit_code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())


