"""Soak: a long MixedSync job whose non-central parties are killed (kill -9 of every process) and restarted at
random times, over an emulated WAN whose DGT channels lose 1% of their datagrams. Not part of CI.

It launches each party separately (as on separate hosts, ``geomx.launch.launch(..., party=...)``), every
worker running ``benchmarks/soak_worker.py`` until a common deadline. A chaos loop kills a random party,
waits until the global scheduler must have declared it dead (heartbeat timeout + margin), and starts it again:
it rejoins with the current global model. Every ``--sample`` seconds it reads every process's resident memory
(``/proc/PID/status``) and the central worker's step count. At the end it prints steps per second per window
and each long-lived process's memory at start, middle and end with a fitted slope (both should stay flat),
and writes everything to ``OUT/soak.json``.

Usage::

    .venv/bin/python benchmarks/soak.py --minutes 30            # the issue's soak
    .venv/bin/python benchmarks/soak.py --minutes 3 --restart-every 40 60   # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from geomx.launch import LaunchResult, free_port, job_processes, launch
from geomx.runs.runlog import read_metrics

HERE = Path(__file__).resolve().parent
HEARTBEAT_S = 5.0


def write_topology(path: Path, parties: int, loss: float) -> Path:
    raw = {
        "parties": {f"dc{i}": {"workers": 1} for i in range(parties)},
        "central": "dc0",
        "links": {"lan": {"bandwidth": "10Gbit", "latency": "0ms"},
                  "wan": {"bandwidth": "100Mbit", "latency": "25ms"}},
        "timeouts": {"heartbeat": f"{HEARTBEAT_S:g}s", "heartbeat_interval": "0.5s", "shutdown": "60s"},
        "dgt": {"k": 0.8, "channels": 3, "loss": loss, "seed": 7},
    }
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


class Party:
    """One party's launcher, run in a thread; ``kill`` sends SIGKILL to all its processes."""

    def __init__(self, name: str, topology: Path, command: list[str], out: Path, global_scheduler: str,
                 incarnation: int) -> None:
        self.name = name
        self.run_dir = out / f"{name}-{incarnation}"
        self.log = out / f"{name}-{incarnation}.log"
        self.result: LaunchResult | None = None
        self._args = (topology, command, global_scheduler)
        self.thread = threading.Thread(target=self._run, name=f"launch-{name}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        topology, command, global_scheduler = self._args
        with open(self.log, "w") as log:
            self.result = launch(topology, command, run_dir=self.run_dir, party=self.name, out=log,
                                 global_scheduler=global_scheduler)

    def kill(self) -> int:
        pids = list(job_processes({str(self.run_dir)}))
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        return len(pids)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--parties", type=int, default=3)
    parser.add_argument("--restart-every", type=float, nargs=2, default=(90.0, 180.0), metavar=("MIN", "MAX"),
                        help="seconds between kills, drawn uniformly")
    parser.add_argument("--loss", type=float, default=0.01, help="DGT datagram loss per channel")
    parser.add_argument("--sample", type=float, default=10.0, help="seconds between memory samples")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None,
                        help="a new folder for this soak (default: bench-results/soak-<date>-<time>)")
    args = parser.parse_args()
    args.out = args.out or Path("bench-results") / f"soak-{time.strftime('%Y%m%d-%H%M%S')}"
    if args.out.exists() and any(args.out.iterdir()):
        # an earlier soak's run folders would be launched into again, and their metrics read as this run's steps
        parser.error(f"--out {args.out} is not empty (an earlier soak?): give a new folder")
    rng = random.Random(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    topology = write_topology(args.out / "soak.yaml", args.parties, args.loss)
    started = time.time()
    deadline = started + args.minutes * 60
    command = [sys.executable, str(HERE / "soak_worker.py"), "--until", repr(deadline)]
    global_scheduler = f"127.0.0.1:{free_port()}"
    incarnations = {f"dc{i}": 0 for i in range(args.parties)}
    parties = {name: Party(name, topology, command, args.out, global_scheduler, 0) for name in incarnations}
    all_runs = {str(p.run_dir) for p in parties.values()}
    samples: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    next_kill = time.time() + rng.uniform(*args.restart_every)
    next_sample = time.time()
    print(f"soak: {args.minutes:g} min, {args.parties} parties x 1 worker, MixedSync + DGT at {args.loss:.0%} loss, "
          f"kills every {args.restart_every[0]:g}-{args.restart_every[1]:g} s; logs in {args.out}", flush=True)
    while time.time() < deadline + 5 and any(p.thread.is_alive() for p in parties.values()):
        now = time.time()
        if now >= next_sample:
            next_sample = now + args.sample
            memory = {f"{env.get('GEOMX_PARTY')}/{env.get('GEOMX_ROLE')}#{Path(env['GEOMX_RUN_DIR']).name}":
                      rss_mb(pid) for pid, env in job_processes(all_runs).items()}
            records = read_metrics(parties["dc0"].run_dir).get("dc0_worker0", [])
            samples.append({"t": now - started, "rss_mb": memory, "dc0_step": records[-1]["step"] if records else 0})
        if now >= next_kill and now < deadline - 60:
            victim = rng.choice(sorted(incarnations)[1:])
            killed = parties[victim].kill()
            parties[victim].thread.join(timeout=60)
            events.append({"t": time.time() - started, "event": "kill", "party": victim, "processes": killed})
            print(f"[{time.time() - started:7.1f} s] killed {victim} ({killed} processes)", flush=True)
            time.sleep(HEARTBEAT_S + 3.0)  # until the global scheduler has declared it dead
            incarnations[victim] += 1
            parties[victim] = Party(victim, topology, command, args.out, global_scheduler, incarnations[victim])
            all_runs.add(str(parties[victim].run_dir))
            events.append({"t": time.time() - started, "event": "restart", "party": victim})
            print(f"[{time.time() - started:7.1f} s] restarted {victim}", flush=True)
            next_kill = time.time() + rng.uniform(*args.restart_every)
        time.sleep(0.5)
    for party in parties.values():
        party.thread.join(timeout=120)
    return report(args, samples, events, parties, started)


def report(args: argparse.Namespace, samples: list[dict[str, Any]], events: list[dict[str, Any]],
           parties: dict[str, Party], started: float) -> int:
    """Print steps per second per window and memory trends; write soak.json. Exit 1 if a last incarnation failed."""
    window = max(60.0, args.minutes * 60 / 6)
    print(f"\ndc0's steps per second, per {window:.0f} s window:")
    rates = []
    edges = np.arange(0.0, samples[-1]["t"] + 1e-9, window) if samples else []
    for lo in edges:
        inside = [s for s in samples if lo <= s["t"] <= lo + window]
        if len(inside) >= 2 and inside[-1]["t"] > inside[0]["t"]:
            rate = (inside[-1]["dc0_step"] - inside[0]["dc0_step"]) / (inside[-1]["t"] - inside[0]["t"])
            rates.append({"from_s": lo, "steps_per_s": rate})
            print(f"  {lo:6.0f}-{lo + window:6.0f} s  {rate:6.2f}")
    print("\nresident memory (MB) of every process that lived through the whole run:")
    print(f"  {'process':<34}{'start':>8}{'middle':>8}{'end':>8}{'max':>8}{'MB/min':>9}")
    trends = {}
    names = set().union(*(s["rss_mb"] for s in samples)) if samples else set()
    for name in sorted(names):
        series = [(s["t"], s["rss_mb"][name]) for s in samples if s["rss_mb"].get(name) is not None]
        if len(series) < 3 or series[0][0] > 60 or series[-1][0] < samples[-1]["t"] - 60:
            continue
        ts, mb = np.array([t for t, _ in series]), np.array([m for _, m in series])
        settled = ts > ts[0] + 60  # the first minute is start-up (imports, first allocations)
        slope = float(np.polyfit(ts[settled], mb[settled], 1)[0] * 60) if settled.sum() >= 3 else float("nan")
        trends[name] = {"start": mb[0], "middle": mb[len(mb) // 2], "end": mb[-1], "max": mb.max(), "slope": slope}
        print(f"  {name:<34}{mb[0]:8.1f}{mb[len(mb) // 2]:8.1f}{mb[-1]:8.1f}{mb.max():8.1f}{slope:9.3f}")
    kills = sum(1 for e in events if e["event"] == "kill")
    finals = {name: (p.result.exit_code if p.result else None) for name, p in parties.items()}
    print(f"\n{kills} kills and restarts; last incarnations' exit codes: {finals}; wall {time.time() - started:.0f} s")
    (args.out / "soak.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                    "events": events, "samples": samples, "rates": rates,
                                                    "memory": trends, "exit_codes": finals}, indent=1, default=float))
    return 0 if all(code == 0 for code in finals.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
