"""Integration worker: train until the test writes ``$GEOMX_RUN_DIR/out/stop`` (or ``--limit-s`` passes).

Default: jobkit's model in a plain PyTorch loop wrapped in ``DistributedOptimizer`` (so every worker notes its
step and busy share for the status page); ``--kvstore``: pushpull one tensor with the kvstore API instead. Every
worker stops at the same step: the master's decision travels as one more key's sum, so no worker waits for a
round the others never join. Used by test_status_page.py, which watches the job through the global scheduler's
status page while it runs.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import jobkit
import torch
import torch.nn.functional as F

import geomx
import geomx.torch as gx

STOP_KEY = 1000  # beyond the model's keys


def kvstore_step() -> tuple[geomx.kv.KVStore, Callable[[], None], Callable[[], None]]:
    kv = geomx.kv.create("dist_sync")
    value = torch.ones(50_000)
    kv.init(0, value)
    return kv, lambda: kv.pushpull(0, torch.full_like(value, float(kv.global_rank + 1)), value), kv.close


def wrapper_step() -> tuple[geomx.kv.KVStore, Callable[[], None], Callable[[], None]]:
    torch.manual_seed(0)
    model = jobkit.make_model()
    opt = gx.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), model)
    data = torch.Generator().manual_seed(opt.kv.global_rank)

    def step() -> None:
        x = torch.randn(32, jobkit.IN_FEATURES, generator=data)
        y = torch.randint(jobkit.OUT_FEATURES, (32,), generator=data)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()

    return opt.kv, step, opt.close


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kvstore", action="store_true", help="the kvstore API instead of the PyTorch wrapper")
    parser.add_argument("--limit-s", type=float, default=150.0, help="stop by then even if nobody says so")
    args = parser.parse_args()
    kv, step, close = kvstore_step() if args.kvstore else wrapper_step()
    flag = torch.zeros(1)
    kv.init(STOP_KEY, flag)
    stop = jobkit.out_dir(kv.config.run_dir) / "stop"
    deadline = time.monotonic() + args.limit_s
    while True:
        step()
        done = kv.is_master_worker and (stop.exists() or time.monotonic() > deadline)
        kv.pushpull(STOP_KEY, torch.full_like(flag, 1.0 if done else 0.0), flag)
        if float(flag[0]) > 0:
            break
    close()


if __name__ == "__main__":
    jobkit.run_and_exit(main)
