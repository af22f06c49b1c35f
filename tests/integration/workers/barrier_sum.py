"""Integration worker without a server optimizer: barriers, plain sums, and the master-only optimizer rule.

Writes ``$GEOMX_RUN_DIR/out/barrier<global rank>.json``.
"""

from __future__ import annotations

import argparse
import json
import time

import jobkit
import torch

import geomx


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--slow-ranks", type=int, nargs="*", default=[3, 1], help="one per barrier")
    parser.add_argument("--delay", type=float, default=1.5)
    args = parser.parse_args()
    kv = geomx.kv.create("dist_sync")
    rank = kv.global_rank
    report: dict = {"name": kv.name, "global_rank": rank, "num_all_workers": kv.num_all_workers}

    if not kv.is_master_worker:
        try:
            kv.set_optimizer(geomx.optim.SGD(lr=0.1))
            report["set_optimizer"] = {"outcome": "no error", "text": ""}
        except Exception as exc:
            report["set_optimizer"] = {"outcome": type(exc).__name__, "text": str(exc)}

    # No optimizer anywhere: the global server answers with the sum of all workers' pushes.
    small, big = torch.full((3,), 100.0 + rank), torch.full((5, 40), -1.0 - rank)  # big spans several slices
    kv.init([0, 1], [small, big])
    report["init"] = [small.tolist(), big[0, 0].item()]
    sums = []
    for round_ in range(2):
        value = torch.full((3,), float((rank + 1) * 10 ** round_))
        kv.pushpull(0, value)
        matrix = torch.arange(200, dtype=torch.float32).reshape(5, 40) * (rank + 1) + round_
        kv.push(1, matrix)
        kv.pull(1, matrix)
        sums.append({"key0": value.tolist(), "key1_equal": bool(torch.equal(
            matrix, torch.arange(200, dtype=torch.float32).reshape(5, 40) * sum(range(1, kv.num_all_workers + 1))
            + round_ * kv.num_all_workers))})
    pulled = torch.zeros(3)
    kv.pull(0, pulled)  # a plain PULL (no push pending): the latest value
    report["sums"] = sums
    report["pulled"] = pulled.tolist()

    # Barriers: one slow worker per barrier; everyone notes when it entered and when it left.
    report["barriers"] = []
    for slow in args.slow_ranks:
        if rank == slow:
            time.sleep(args.delay)  # the deliberate slow-down under test, not a synchronization
        entered = time.time()
        kv.barrier()
        report["barriers"].append({"slow": slow, "entered": entered, "left": time.time()})

    out = jobkit.out_dir(kv.config.run_dir) / f"barrier{rank}.json"
    out.write_text(json.dumps(report))
    kv.close()


if __name__ == "__main__":
    jobkit.run_and_exit(main)
