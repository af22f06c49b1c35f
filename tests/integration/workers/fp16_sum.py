"""Integration worker for fp16 tensors (the seeds' FP16 loop): fp16 init buffers, push fp16, pull fp16.

Rank 0 pushes 2048 at once; the others push 1.0 half a second later. In fp16, 2048 + 1 rounds back to
2048, so a server that sums in fp16 answers 2048; one that sums in fp32 answers 2048 + (workers - 1).
"""

from __future__ import annotations

import json
import time

import torch

import geomx


def main() -> None:
    kv = geomx.kv.create("dist_sync")
    buffer = torch.zeros(8, dtype=torch.float16)
    kv.init(0, buffer)
    kv.barrier()
    if kv.global_rank != 0:
        time.sleep(0.5)  # let the big value arrive first (the order that loses precision in fp16)
    value = torch.full((8,), 2048.0 if kv.global_rank == 0 else 1.0, dtype=torch.float16)
    kv.push(0, value)
    out = torch.empty(8, dtype=torch.float16)
    kv.pull(0, out)
    assert kv.config.run_dir is not None
    (kv.config.run_dir / f"fp16_{kv.global_rank}.json").write_text(json.dumps({"pulled": out.float().tolist(),
                                                                               "dtype": str(out.dtype)}))
    kv.close()


if __name__ == "__main__":
    main()
