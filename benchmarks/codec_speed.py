"""Codec throughput on this machine: encode / decode milliseconds per MB and compression ratio.

Each codec encodes synthetic float32 gradients of 1M and 10M elements several times on one slot (so
stateful codecs run in steady state), then decodes the last payload. "MB" is 1e6 bytes of the dense
float32 tensor; "ratio" is encoded frame bytes / dense bytes, measured (not estimated). A second table
times Bi-Sparse's selection alone: exact top-k (``np.argpartition`` over all n) against the sampled
threshold, on the same |v|. Times are minimums over the repeats (medians go to the JSON). Like every
geomx benchmark it prints and never asserts; ``--json PATH`` also writes the raw figures.

Usage::

    .venv/bin/python benchmarks/codec_speed.py                 # about 10 s on 2 cores
    .venv/bin/python benchmarks/codec_speed.py --sizes 1000000 --repeats 3 --json codec_speed.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from geomx.codecs import Codec, Encoded, TensorInfo, make_codec
from geomx.codecs.bsc import top_k_exact, top_k_sampled

SPECS: dict[str, dict[str, Any]] = {
    "dense": {"type": "dense"},
    "fp16": {"type": "fp16"},
    "int8 (block 256)": {"type": "int8", "block": 256},
    "ef(int8)": {"type": "error_feedback", "inner": {"type": "int8", "block": 256}},
    "bsc 1% sampled": {"type": "bsc", "threshold": 0.01, "size_lower_bound": 0},
    "bsc 1% exact": {"type": "bsc", "threshold": 0.01, "size_lower_bound": 0, "exact": True},
    "mpq 1%": {"type": "mpq", "threshold": 0.01, "size_lower_bound": 200_000},
}
INFO = TensorInfo(key=0, part=0, kind="gradient", direction="push")


def timed_ms(function: Callable[[], object], repeats: int) -> tuple[float, float]:
    """(minimum, median) milliseconds of ``repeats`` calls. The table prints the minimum: on a shared
    machine other processes only ever add time, so the minimum is the steadiest estimate of the cost."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3, statistics.median(times) * 1e3


def codec_rows(sizes: list[int], repeats: int, rng: np.random.Generator) -> list[dict[str, Any]]:
    rows = []
    for n in sizes:
        grads = [rng.standard_normal(n).astype(np.float32) for _ in range(3)]
        megabytes = n * 4 / 1e6
        for label, spec in SPECS.items():
            codec = make_codec(spec)
            codec.encode(grads[0], INFO)  # the first step allocates the slot's state: not timed
            payloads: list[Encoded] = []
            encode_ms, encode_median = timed_ms(partial(encode_next, codec, grads, payloads), repeats)
            payload = payloads[-1]
            decode_ms, decode_median = timed_ms(partial(codec.decode, payload, (n,), np.dtype(np.float32)), repeats)
            rows.append({"codec": label, "n": n, "encode_ms_per_mb": encode_ms / megabytes,
                         "decode_ms_per_mb": decode_ms / megabytes, "encode_ms": encode_ms,
                         "decode_ms": decode_ms, "encode_ms_median": encode_median, "decode_ms_median": decode_median,
                         "ratio": payload.nbytes / (n * 4), "codec_id": payload.codec_id})
    return rows


def encode_next(codec: Codec, grads: list[np.ndarray], payloads: list[Encoded]) -> None:
    """One round of a slot: encode the next gradient (cycling), keep the payload for the decode timing."""
    payloads.append(codec.encode(grads[len(payloads) % len(grads)], INFO))


def topk_rows(sizes: list[int], repeats: int, rng: np.random.Generator) -> list[dict[str, Any]]:
    rows = []
    for n in sizes:
        magnitude = np.abs(rng.standard_normal(n).astype(np.float32))
        for threshold in (0.01, 0.001):
            k = max(1, int(n * threshold))
            exact_ms, exact_median = timed_ms(partial(top_k_exact, magnitude, k), repeats)
            sampled_ms, sampled_median = timed_ms(partial(top_k_sampled, magnitude, k, rng), repeats)
            found = top_k_sampled(magnitude, k, rng)
            same = np.array_equal(np.sort(found), np.sort(top_k_exact(magnitude, k)))
            rows.append({"n": n, "threshold": threshold, "k": k, "exact_ms": exact_ms, "sampled_ms": sampled_ms,
                         "exact_ms_median": exact_median, "sampled_ms_median": sampled_median,
                         "exact_over_sampled": exact_ms / sampled_ms, "sampled_count": int(found.size),
                         "sampled_equals_exact": bool(same)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--json", help="also write the raw figures to this path")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    load = os.getloadavg()[0]
    print(f"numpy {np.__version__}, {os.cpu_count()} cores, {platform.processor() or platform.machine()}, "
          f"load {load:.2f}; minimum of {args.repeats} runs (medians in --json)")
    codecs = codec_rows(args.sizes, args.repeats, rng)
    print(f"\n{'codec':<18}{'n':>11}{'enc ms/MB':>11}{'dec ms/MB':>11}{'enc ms':>9}{'dec ms':>9}{'ratio':>9}")
    for row in codecs:
        print(f"{row['codec']:<18}{row['n']:>11}{row['encode_ms_per_mb']:>11.3f}{row['decode_ms_per_mb']:>11.3f}"
              f"{row['encode_ms']:>9.1f}{row['decode_ms']:>9.1f}{row['ratio']:>9.4f}")
    topk = topk_rows(args.sizes, args.repeats, rng)
    print(f"\n{'top-k selection':<16}{'n':>11}{'k':>9}{'exact ms':>10}{'sampled ms':>12}{'exact/sampled':>15}"
          f"{'same set':>10}")
    for row in topk:
        same = "yes" if row["sampled_equals_exact"] else "no"
        print(f"{'  ' + str(row['threshold']):<16}{row['n']:>11}{row['k']:>9}{row['exact_ms']:>10.2f}"
              f"{row['sampled_ms']:>12.2f}{row['exact_over_sampled']:>14.1f}x{same:>10}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"numpy": np.__version__, "cores": os.cpu_count(), "load": load, "repeats": args.repeats,
                       "codecs": codecs, "topk": topk}, out, indent=1)


if __name__ == "__main__":
    main()
