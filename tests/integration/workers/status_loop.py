"""Integration worker: pushpull one tensor, step after step, until the test writes ``$GEOMX_RUN_DIR/out/stop``
(or ``--limit-s`` passes). Every worker stops at the same step: the master's decision travels as a second key's
sum, so no worker waits for a pushpull the others never make. Used by test_status_page.py, which watches the job
through the global scheduler's status page while it runs.
"""

from __future__ import annotations

import argparse
import time

import jobkit
import torch

import geomx


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--limit-s", type=float, default=150.0, help="stop by then even if nobody says so")
    args = parser.parse_args()
    kv = geomx.kv.create("dist_sync")
    value, flag = torch.ones(50_000), torch.zeros(1)
    kv.init(0, value)
    kv.init(1, flag)
    stop = jobkit.out_dir(kv.config.run_dir) / "stop"
    deadline = time.monotonic() + args.limit_s
    while True:
        kv.pushpull(0, torch.full_like(value, float(kv.global_rank + 1)), value)
        done = kv.is_master_worker and (stop.exists() or time.monotonic() > deadline)
        kv.pushpull(1, torch.full_like(flag, 1.0 if done else 0.0), flag)
        if float(flag[0]) > 0:
            break
    kv.close()


if __name__ == "__main__":
    jobkit.run_and_exit(main)
