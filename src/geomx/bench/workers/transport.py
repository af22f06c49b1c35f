"""Bench worker: time ``kv.pushpull`` of large float32 tensors against the server(s), no training.

Started by ``geomx bench`` through the launcher, one process per worker of the topology::

    geomx launch flat1.yaml -- python -m geomx.bench.workers.transport --sizes-mb 4 100 --reps 10

For each size, every worker inits one key, runs ``--warmup`` untimed pushpulls, then ``--reps`` timed
ones (each timed alone, output into a separate tensor so the pushed values never change). The master
worker appends one metrics record per size: the per-operation times and ``gbps`` = tensor bytes / mean
time per pushpull (1 GB = 1e9 bytes).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import geomx


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[4.0, 100.0],
                        help="tensor sizes in MB (1e6 bytes) of float32")
    parser.add_argument("--reps", type=int, default=10, help="timed pushpulls per size")
    parser.add_argument("--warmup", type=int, default=2, help="untimed pushpulls per size first")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    kv = geomx.kv.create("dist_sync")
    for key, size_mb in enumerate(args.sizes_mb):
        numel = int(size_mb * 1e6) // 4
        value = torch.full((numel,), 1.0 / max(kv.num_all_workers, 1), dtype=torch.float32)
        out = torch.empty_like(value)
        kv.init(key, value)
        for _ in range(args.warmup):
            kv.pushpull(key, value, out=out)
        times = []
        for _ in range(args.reps):
            started = time.perf_counter()
            kv.pushpull(key, value, out=out)
            times.append(time.perf_counter() - started)
        nbytes = numel * 4
        mean = statistics.fmean(times)
        if kv.is_master_worker:
            kv.record(key=key, size_mb=size_mb, nbytes=nbytes, workers=kv.num_all_workers, reps=args.reps,
                      warmup=args.warmup, times_s=times, mean_s=mean, median_s=statistics.median(times),
                      min_s=min(times), gbps=nbytes / mean / 1e9, check=float(out[0]))
            print(f"pushpull {size_mb:g} MB x{args.reps}: mean {mean * 1000:.1f} ms  "
                  f"min {min(times) * 1000:.1f} ms  {nbytes / mean / 1e9:.3f} GB/s", flush=True)
    kv.close()


if __name__ == "__main__":
    main()
