"""Integration worker for fp16 tensors (the seeds' FP16 loop): fp16 init buffers, push fp16, pull fp16.

Worker ``r`` pushes 2048 in the elements ``e`` with ``e % workers == r`` and 1.0 elsewhere, so every element
sums to 2048 + (workers - 1) = 2050 with 3 workers (exact in fp16). Summed in fp16, 2048 + 1 rounds back to
2048: an element comes out right only if its 2048 arrived last, which can hold for one worker's elements at
most, whatever order the pushes arrive in (no sleep decides the order).
"""

from __future__ import annotations

import json

import jobkit
import torch

import geomx

ELEMENTS = 9


def main() -> None:
    kv = geomx.kv.create("dist_sync")
    buffer = torch.zeros(ELEMENTS, dtype=torch.float16)
    kv.init(0, buffer)
    mine = torch.arange(ELEMENTS) % kv.num_all_workers == kv.global_rank
    value = torch.where(mine, 2048.0, 1.0).to(torch.float16)
    kv.push(0, value)
    out = torch.empty(ELEMENTS, dtype=torch.float16)
    kv.pull(0, out)
    assert kv.config.run_dir is not None
    (kv.config.run_dir / f"fp16_{kv.global_rank}.json").write_text(json.dumps({"pulled": out.float().tolist(),
                                                                               "dtype": str(out.dtype)}))
    kv.close()


if __name__ == "__main__":
    jobkit.run_and_exit(main)
