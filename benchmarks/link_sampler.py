"""What the kernel-shaped link does during a ``wan`` bench row: each direction's rate in short bins, and each WAN
flow's TCP state (RTT, congestion window), sampled from inside the two namespaces (not part of `geomx bench`).

A row's table says how long a step took; this says why the link was not full. It watches for the bench's
namespaces (``geomx.bench.wan.netns``, prefix ``gxw``), enters each with ``setns(2)`` from a thread of its own, and
every ``--every-ms`` reads the veth end's transmit counter (``/proc/thread-self/net/dev``: the thread's
namespace) and every ``--ss-every-ms`` the flows' state (``ss -tin`` started from that thread, so in that
namespace). Linux only, root (the bench needs root anyway). Nothing of geomx is imported: it watches a run from
outside.

Usage (two terminals, or one in the background)::

    sudo python benchmarks/link_sampler.py record /tmp/link.jsonl --seconds 180 &
    sudo .venv/bin/python -m geomx.bench.wan --quick --only geomx_fsa_collective --rates 100 --job mlp
    python benchmarks/link_sampler.py show /tmp/link.jsonl --bin-ms 20 --window 2
"""

from __future__ import annotations

import argparse
import bisect
import ctypes
import json
import os
import re
import statistics
import subprocess
import threading
import time
from collections import defaultdict
from itertools import pairwise
from pathlib import Path
from typing import Any, TextIO

CLONE_NEWNET = 0x40000000
NETNS_DIR = Path("/var/run/netns")


def _enter(namespace: str) -> None:
    """Move the calling thread (only it) into network namespace ``namespace``."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    fd = os.open(NETNS_DIR / namespace, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {namespace}")
    finally:
        os.close(fd)


def _sample(namespace: str, out: TextIO, lock: threading.Lock, stop: threading.Event, every_s: float,
            ss_every_s: float) -> None:
    """One namespace's samples until ``stop`` or the namespace is gone."""
    _enter(namespace)
    last_ss = 0.0
    while not stop.is_set():
        try:
            lines = Path("/proc/thread-self/net/dev").read_text().splitlines()[2:]
        except OSError:
            return
        now = time.time()
        rows = []
        for line in lines:
            name, counters = line.split(":", 1)
            if name.strip() != "lo":
                fields = counters.split()
                rows.append({"t": now, "ns": namespace, "dev": name.strip(), "tx": int(fields[8])})
        if now - last_ss >= ss_every_s:
            last_ss = now
            flows = subprocess.run(["ss", "-tinH"], capture_output=True, text=True, timeout=5).stdout
            rows.append({"t": now, "ns": namespace, "ss": flows})
        with lock:
            out.writelines(json.dumps(row) + "\n" for row in rows)
        time.sleep(every_s)


def record(path: Path, seconds: float, prefix: str, every_s: float, ss_every_s: float) -> None:
    """Sample every namespace named ``prefix*`` that appears within ``seconds``, into ``path`` (JSON lines)."""
    lock = threading.Lock()
    watching: dict[str, threading.Event] = {}
    deadline = time.monotonic() + seconds
    with path.open("w") as out:
        while time.monotonic() < deadline:
            present = {p.name for p in NETNS_DIR.glob(f"{prefix}*")} if NETNS_DIR.exists() else set()
            for namespace in present - set(watching):
                watching[namespace] = threading.Event()
                threading.Thread(target=_sample, args=(namespace, out, lock, watching[namespace], every_s,
                                                       ss_every_s), daemon=True).start()
            for namespace in set(watching) - present:
                watching.pop(namespace).set()
            time.sleep(0.2)
        for stop in watching.values():
            stop.set()
        time.sleep(max(every_s, 0.05) * 2)  # let the threads finish their last write


def _rates(series: list[tuple[float, int]], bins: list[tuple[float, float]]) -> list[float | None]:
    """Mbit/s sent in each bin (None where no two samples fall in it)."""
    times = [t for t, _ in series]
    rates: list[float | None] = []
    for start, stop in bins:
        i, j = bisect.bisect_left(times, start), bisect.bisect_left(times, stop)
        j = min(j, len(times) - 1)
        rates.append(None if j <= i else (series[j][1] - series[i][1]) * 8 / (times[j] - times[i]) / 1e6)
    return rates


def _flows(rows: list[dict[str, Any]], addresses: tuple[str, str]) -> dict[str, list[tuple[float, float, int]]]:
    """Per WAN flow (local -> peer, the two veth addresses), (t, RTT ms, cwnd) at each ``ss`` sample that had data
    in flight."""
    flows: dict[str, list[tuple[float, float, int]]] = defaultdict(list)
    for row in rows:
        lines = row.get("ss", "").splitlines()
        for head, detail in pairwise(lines):
            fields = head.split()
            if len(fields) < 5 or not head.startswith("ESTAB"):
                continue
            local, peer = fields[3], fields[4]
            if not any(a in local for a in addresses) or not any(a in peer for a in addresses) or \
                    local.rsplit(":", 1)[0] == peer.rsplit(":", 1)[0]:
                continue
            rtt, cwnd = re.search(r" rtt:([\d.]+)/", detail), re.search(r"cwnd:(\d+)", detail)
            if rtt and cwnd and "unacked:" in detail:
                flows[f"{local} -> {peer}"].append((row["t"], float(rtt.group(1)), int(cwnd.group(1))))
    return flows


def show(path: Path, bin_ms: float, window_s: float) -> None:
    """Print a ``window_s`` stretch of the busiest part in ``bin_ms`` bins, the whole run's per-direction summary,
    and the WAN flows' RTT and congestion window while they had data in flight."""
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut by the recorder's end
    series: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for row in rows:
        if "dev" in row and row["dev"].startswith("gxw"):  # the veth ends (netns names them after the link)
            series[f"{row['ns']}/{row['dev']}"].append((row["t"], row["tx"]))
    if len(series) != 2:
        raise SystemExit(f"{path}: expected the two veth ends of one link, found {sorted(series) or 'none'}")
    (name_a, a), (name_b, b) = sorted(series.items())
    busy = [t for (t, v), (_, w) in pairwise(a) if w - v > 10_000]
    if not busy:
        raise SystemExit(f"{path}: nothing crossed the link while it was sampled")
    width = bin_ms / 1000
    bins = [(busy[0] + i * width, busy[0] + (i + 1) * width) for i in range(int((busy[-1] - busy[0]) / width))]
    rate_a, rate_b = _rates(a, bins), _rates(b, bins)
    middle = len(bins) // 2
    shown = range(middle, min(len(bins), middle + int(window_s / width)))
    print(f"A = {name_a}, B = {name_b}; Mbit/s per {bin_ms:g} ms bin, a {window_s:g} s stretch from the middle:")
    for i in shown:
        x, y = rate_a[i], rate_b[i]
        print(f"{bins[i][0] - bins[middle][0]:7.3f}  A->B {'-' if x is None else f'{x:5.1f}':>5} "
              f"{'#' * int((x or 0) / 5):<24} B->A {'-' if y is None else f'{y:5.1f}':>5} {'*' * int((y or 0) / 5)}")
    for label, rates in (("A->B", rate_a), ("B->A", rate_b)):
        known = [r for r in rates if r is not None]
        print(f"{label}: mean {statistics.mean(known):.1f} Mbit/s over {len(known) * width:.1f} s busy; bins at "
              f"85+ Mbit/s {100 * sum(r >= 85 for r in known) / len(known):.0f}%, at 40-85 "
              f"{100 * sum(40 <= r < 85 for r in known) / len(known):.0f}%, under 10 "
              f"{100 * sum(r < 10 for r in known) / len(known):.0f}%")
    addresses = tuple(sorted({m for row in rows for m in re.findall(r"(10\.\d+\.\d+\.\d+):", row.get("ss", ""))}))
    for flow, samples in sorted(_flows(rows, addresses).items()):
        if len(samples) >= 5:
            rtts, cwnds = sorted(s[1] for s in samples), sorted(s[2] for s in samples)
            print(f"{flow}: {len(samples)} samples with data in flight: RTT median {statistics.median(rtts):.1f} ms "
                  f"(p90 {rtts[9 * len(rtts) // 10]:.1f}), cwnd median {statistics.median(cwnds):.0f} packets")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = parser.add_subparsers(dest="verb", required=True)
    rec = verbs.add_parser("record", help="sample the link while a bench runs")
    rec.add_argument("out", type=Path)
    rec.add_argument("--seconds", type=float, default=300.0, help="stop after this long")
    rec.add_argument("--prefix", default="gxw", help="the namespaces to watch (geomx.bench.wan.netns's prefix)")
    rec.add_argument("--every-ms", type=float, default=5.0)
    rec.add_argument("--ss-every-ms", type=float, default=250.0)
    view = verbs.add_parser("show", help="print a recording")
    view.add_argument("recording", type=Path)
    view.add_argument("--bin-ms", type=float, default=20.0)
    view.add_argument("--window", type=float, default=2.0, help="seconds of bins to print")
    args = parser.parse_args()
    if args.verb == "record":
        record(args.out, args.seconds, args.prefix, args.every_ms / 1000, args.ss_every_ms / 1000)
    else:
        show(args.recording, args.bin_ms, args.window)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
