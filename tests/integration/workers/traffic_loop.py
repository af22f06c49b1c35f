"""Integration worker: pushpull one tensor for ``--steps`` steps (0: until stopped), the master recording each step.

The master writes ``$GEOMX_RUN_DIR/out/started`` after ``--started-after`` steps: what a test waits for before
it stops the job (no sleeps). ``--die-rank R --die-after N``: worker R, after N steps, waits until its own stats
file holds those steps' bytes (the running count, rewritten every second), then ends with ``os._exit(3)``: no
clean exit, so that file is the only count of it. Used by test_traffic_counts.py: the launcher's totals, the
stats files and ``geomx report`` from one source, and a stopped job's counts.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import time

import jobkit
import torch

import geomx


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=jobkit.STEPS, help="0: until the job is stopped")
    parser.add_argument("--started-after", type=int, default=3)
    parser.add_argument("--die-rank", type=int, default=-1)
    parser.add_argument("--die-after", type=int, default=3)
    args = parser.parse_args()
    kv = geomx.kv.create("dist_sync")
    value = torch.ones(20_000)
    kv.init(0, value)
    steps = itertools.count() if args.steps == 0 else range(args.steps)
    for step in steps:
        kv.pushpull(0, torch.full_like(value, float(kv.global_rank + 1)), value)
        if kv.is_master_worker:
            kv.record(step=step + 1, loss=float(value[0]), wan_mb=kv.wan_bytes() / 1e6)
            if step + 1 == args.started_after:
                started = jobkit.out_dir(kv.config.run_dir) / "started"
                started.with_suffix(".tmp").write_text(str(step + 1))
                started.with_suffix(".tmp").replace(started)
        if kv.global_rank == args.die_rank and step + 1 == args.die_after:
            die_once_counted(kv, (step + 1) * value.numel() * 4)
    kv.close()


def die_once_counted(kv: geomx.kv.KVStore, sent: int, timeout: float = 30.0) -> None:
    """``os._exit(3)`` once this worker's stats file says it sent ``sent`` LAN bytes (or after ``timeout``)."""
    path = kv.config.run_dir / "stats" / f"{kv.name.replace('/', '_')}.json"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if json.loads(path.read_text())["lan"]["sent"] >= sent:
                break
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.05)
    os._exit(3)


if __name__ == "__main__":
    jobkit.run_and_exit(main)
