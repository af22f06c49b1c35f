"""Codec throughput on this machine: encode / decode milliseconds per MB and compression ratio.

The functions live in ``geomx.bench.codecs`` (``geomx bench --only codecs`` runs them too). Each codec
encodes synthetic float32 gradients of 1M and 10M elements several times on one slice (so stateful codecs
run in steady state), then decodes the last payload. "MB" is 1e6 bytes of the dense
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

import numpy as np

from geomx.bench.codecs import codec_speed_rows, topk_rows


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
    codecs = codec_speed_rows(args.sizes, args.repeats, rng)
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
