"""Old vs new default ``slice_elems`` on a full-duplex link: the digits MLP FSA job (benchmarks/mlp_fsa.py).

Three links, each run side by side in one invocation, in the order old, new, new, old (drift cancels):

* ``--link emulated``: one ``geomx launch`` of 2 parties x 2 workers on geomx's own WAN emulator
  (100 Mbit/s, 25 ms one way; LAN 10 Gbit/s), as ``topologies/demo.yaml``;
* ``--link loopback``: the same without emulation (what smaller slices cost where the link is fast);
* ``--link netns`` (root, ``ip`` and ``tc``): two network namespaces joined by a veth pair shaped by the
  kernel's ``tbf`` at ``--mbit`` on both ends (no added delay: this kernel has no ``netem``); one per-party
  ``geomx launch`` in each namespace, geomx's emulator off. The namespaces (private addresses 10.251.0.1/30
  and .2) are deleted afterwards, also on failure or Ctrl-C. A TCP probe measures the shaped rate first.

It prints s/step per run, their means per configuration, and the bytes each direction of the veth carried
(qdisc counters); ``--out FILE`` writes the same as JSON. A small stand-in until ``geomx bench --only wan``.

Usage::

    sudo .venv/bin/python benchmarks/duplex_link.py --link netns --steps 40
    .venv/bin/python benchmarks/duplex_link.py --link emulated --steps 40
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from geomx.config import LAN_SLICE_ELEMS, WAN_SLICE_ELEMS
from geomx.runs.runlog import read_metrics

HERE = Path(__file__).resolve().parent
OLD_SLICE_ELEMS = LAN_SLICE_ELEMS  # the default of every job before issue 14, now of one-party jobs
ADDRESSES = ("10.251.0.1", "10.251.0.2")  # dc0's namespace, dc1's namespace (a private /30)


def topology(slice_elems: int, emulated: bool) -> dict[str, Any]:
    """2 parties x 2 workers, dc0 central; the emulated WAN only when ``emulated``."""
    raw: dict[str, Any] = {"parties": {"dc0": {"workers": 2}, "dc1": {"workers": 2}}, "central": "dc0",
                           "slice_elems": slice_elems,
                           "timeouts": {"register": "120s", "request": "300s", "round": "300s"}}
    if emulated:
        raw["links"] = {"lan": {"bandwidth": "10Gbit", "latency": "0ms"},
                        "wan": {"bandwidth": "100Mbit", "latency": "25ms"}}
    return raw


def sh(*argv: str, check: bool = True) -> str:
    """Run a command (ip / tc), return its stdout; raise with its stderr when it fails and ``check``."""
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {proc.stderr.strip()}")
    return proc.stdout


@contextmanager
def namespaces(mbit: float) -> Iterator[tuple[str, str]]:
    """Two namespaces joined by a tbf-shaped veth pair; deleted on exit (deleting them deletes the veth)."""
    tag = f"gxd{os.getpid()}"
    names = (f"{tag}a", f"{tag}b")
    try:
        for ns in names:
            sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", f"{tag}A", "type", "veth", "peer", "name", f"{tag}B")
        for ns, dev, addr in zip(names, (f"{tag}A", f"{tag}B"), ADDRESSES, strict=True):
            sh("ip", "link", "set", dev, "netns", ns)
            sh("ip", "-n", ns, "addr", "add", f"{addr}/30", "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", f"{mbit:g}mbit",
               "burst", "256kb", "latency", "100ms")
        yield names
    finally:
        for ns in names:
            sh("ip", "netns", "del", ns, check=False)
        left = [ns for ns in names if ns in sh("ip", "netns", "list", check=False)]
        if left:
            print(f"WARNING: could not delete namespaces {left}", file=sys.stderr)


def qdisc_sent(ns: str) -> int:
    """Bytes the namespace's veth end has sent through its tbf (its direction of the link)."""
    words = sh("ip", "netns", "exec", ns, "tc", "-s", "qdisc", "show").split()
    counts = [int(words[i + 1]) for i, word in enumerate(words[:-1]) if word == "Sent"]
    return max(counts, default=0)


PROBE = """
import socket, sys, time
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30)
chunk = b"x" * 65536; end = time.monotonic() + float(sys.argv[3]); n = 0
while time.monotonic() < end:
    s.sendall(chunk); n += len(chunk)
s.close(); print(n)
"""

SINK = """
import socket, sys
srv = socket.socket(); srv.bind((sys.argv[1], 0)); srv.listen(1); print(srv.getsockname()[1], flush=True)
conn, _ = srv.accept()
while conn.recv(1 << 20):
    pass
"""


def probe_rate(names: tuple[str, str], seconds: float = 2.0) -> float:
    """Mbit/s of one TCP stream from dc1's namespace to dc0's, as the application sees it."""
    sink = subprocess.Popen(["ip", "netns", "exec", names[0], sys.executable, "-c", SINK, ADDRESSES[0]],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert sink.stdout is not None
        port = sink.stdout.readline().strip()
        started = time.monotonic()
        sent = int(sh("ip", "netns", "exec", names[1], sys.executable, "-c", PROBE, ADDRESSES[0], port,
                      str(seconds)))
        elapsed = time.monotonic() - started
        sink.wait(timeout=30)
    finally:
        if sink.poll() is None:
            sink.kill()
    return sent * 8 / elapsed / 1e6


def job_command(args: argparse.Namespace) -> list[str]:
    return [sys.executable, str(HERE / "mlp_fsa.py"), "--steps", str(args.steps), "--warmup", str(args.warmup)]


def geomx_launch() -> list[str]:
    return [sys.executable, "-m", "geomx.cli", "launch"]


def run_local(path: Path, run_dir: Path, args: argparse.Namespace) -> None:
    with open(run_dir.with_suffix(".log"), "w") as log:
        code = subprocess.run([*geomx_launch(), str(path), "--run-dir", str(run_dir), "--", *job_command(args)],
                              stdout=log, stderr=subprocess.STDOUT, timeout=args.timeout).returncode
    if code != 0:
        raise RuntimeError(f"launch failed ({code}); see {run_dir.with_suffix('.log')}")


def run_netns(path: Path, run_dir: Path, args: argparse.Namespace, names: tuple[str, str]) -> None:
    """One per-party launch in each namespace, against dc0's global scheduler."""
    port = sh("ip", "netns", "exec", names[0], sys.executable, "-c",
              f"from geomx.launch import free_port; print(free_port({ADDRESSES[0]!r}))").strip()
    procs = []
    for party, ns, addr in zip(("dc0", "dc1"), names, ADDRESSES, strict=True):
        log = open(run_dir.parent / f"{run_dir.name}-{party}.log", "w")  # noqa: SIM115 (closed below)
        argv = ["ip", "netns", "exec", ns, *geomx_launch(), str(path), "--party", party, "--host", addr,
                "--global-scheduler", f"{ADDRESSES[0]}:{port}", "--run-dir", str(run_dir / party), "--",
                *job_command(args)]
        procs.append((subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT), log))
    deadline = time.monotonic() + args.timeout
    try:
        while any(p.poll() is None for p, _ in procs) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        for proc, log in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                proc.wait(timeout=40)
            log.close()
    codes = [p.returncode for p, _ in procs]
    if any(codes):
        raise RuntimeError(f"per-party launches exited with {codes}; see {run_dir.parent}/{run_dir.name}-*.log")


def step_seconds(run_dir: Path) -> dict[str, Any]:
    """The master worker's record (in dc0's run folder for per-party launches): s/step, accuracy, slice_elems."""
    for folder in (run_dir, run_dir / "dc0"):
        for records in read_metrics(folder).values():
            for record in records:
                if "step_s" in record:
                    return record
    raise RuntimeError(f"no step_s record under {run_dir}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--link", choices=["emulated", "loopback", "netns"], required=True)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--mbit", type=float, default=100.0, help="tbf rate of the veth (netns)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    parser.add_argument("--out", type=Path, default=Path("duplex-results"))
    parser.add_argument("--slice-elems", type=int, nargs="+", default=[OLD_SLICE_ELEMS, WAN_SLICE_ELEMS],
                        help="the configurations compared (default: the old and the new default)")
    args = parser.parse_args()
    if args.link == "netns" and os.geteuid() != 0:
        print("--link netns needs root (ip netns, tc)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    names = {OLD_SLICE_ELEMS: "old", WAN_SLICE_ELEMS: "new"}
    configs = {names.get(n, str(n)): n for n in args.slice_elems}
    order = [*configs, *reversed(configs)]  # forward then backward: drift in the machine's load cancels
    report: dict[str, Any] = {"link": args.link, "steps": args.steps, "warmup": args.warmup, "order": order,
                              "slice_elems": configs, "runs": [], "load_before": os.getloadavg()}
    signal.signal(signal.SIGTERM, _interrupted)  # SIGTERM too leaves through the namespaces' cleanup
    with (namespaces(args.mbit) if args.link == "netns" else _nothing()) as spaces:
        if spaces is not None:
            report["probe_mbit"] = probe_rate(spaces)
            print(f"tbf {args.mbit:g} Mbit/s; TCP probe dc1 -> dc0: {report['probe_mbit']:.1f} Mbit/s", flush=True)
        for index, label in enumerate(order):
            path = args.out / f"{args.link}-{label}.yaml"
            path.write_text(yaml.safe_dump(topology(configs[label], args.link == "emulated"), sort_keys=False))
            run_dir = args.out / f"{args.link}-{index}-{label}"
            before = [qdisc_sent(ns) for ns in spaces] if spaces else None
            if spaces is None:
                run_local(path, run_dir, args)
            else:
                run_netns(path, run_dir, args, spaces)
            record = step_seconds(run_dir)
            run = {"config": label, "slice_elems": configs[label], "step_s": record["step_s"],
                   "accuracy": record.get("accuracy"), "load": os.getloadavg()}
            if spaces is not None and before is not None:
                after = [qdisc_sent(ns) for ns in spaces]
                run["mb_per_step"] = {"dc0->dc1": (after[0] - before[0]) / args.steps / 1e6,
                                      "dc1->dc0": (after[1] - before[1]) / args.steps / 1e6}
            report["runs"].append(run)
            print(f"{label} (slice_elems {configs[label]}): {run['step_s']:.3f} s/step, accuracy "
                  f"{run['accuracy']:.3f}, load {run['load'][0]:.1f}"
                  + (f", MB/step on the link {run['mb_per_step']}" if "mb_per_step" in run else ""), flush=True)
    means = {label: statistics.mean(r["step_s"] for r in report["runs"] if r["config"] == label) for label in configs}
    report["mean_step_s"] = means
    first = next(iter(configs))
    report["speedup_over_first"] = {label: means[first] / mean for label, mean in means.items()}
    print("mean s/step: " + ", ".join(f"{label} {mean:.3f} ({means[first] / mean:.2f}x)"
                                      for label, mean in means.items()) + f"; load {os.getloadavg()}")
    (args.out / f"{args.link}.json").write_text(json.dumps(report, indent=2))
    return 0


def _interrupted(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextmanager
def _nothing() -> Iterator[None]:
    yield None


if __name__ == "__main__":
    sys.exit(main())
