"""Bench worker: time ``torch.distributed`` gloo ``all_reduce`` on loopback, the transport baseline.

``geomx bench`` starts ``--world`` copies of this module (one per rank) with a free port::

    python -m geomx.bench.workers.gloo --rank 0 --world 2 --port 41234 --out gloo.json --sizes-mb 4 100

For each size every rank runs ``--warmup`` untimed all_reduces, a barrier, then ``--reps`` timed ones.
Rank 0 writes a JSON list with one entry per size: per-operation times and ``gbps`` = tensor bytes / mean
time per all_reduce (1 GB = 1e9 bytes).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--out", required=True, help="JSON file rank 0 writes")
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[4.0, 100.0])
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{args.host}:{args.port}", rank=args.rank,
                            world_size=args.world)
    results = []
    for size_mb in args.sizes_mb:
        numel = int(size_mb * 1e6) // 4
        tensor = torch.full((numel,), 1.0 / args.world, dtype=torch.float32)
        for _ in range(args.warmup):
            dist.all_reduce(tensor)
        dist.barrier()
        times = []
        for _ in range(args.reps):
            started = time.perf_counter()
            dist.all_reduce(tensor)
            times.append(time.perf_counter() - started)
        nbytes = numel * 4
        mean = statistics.fmean(times)
        results.append({"size_mb": size_mb, "nbytes": nbytes, "processes": args.world, "reps": args.reps,
                        "warmup": args.warmup, "times_s": times, "mean_s": mean,
                        "median_s": statistics.median(times), "min_s": min(times), "gbps": nbytes / mean / 1e9})
    dist.barrier()
    dist.destroy_process_group()
    if args.rank == 0:
        Path(args.out).write_text(json.dumps(results))


if __name__ == "__main__":
    main()
