"""Integration worker of the kvstore's small error paths (``test_kv_calls.py``): calls refused before anything is
sent, two pushes of each key before one pull, and an earlier push's failure raised at the pull.

Every worker runs the same calls, so their rounds stay aligned: a call that sent part of its pushes before it
failed would shift every later round, and the weights would differ from the reference. Writes
``$GEOMX_RUN_DIR/out/kv_calls<global rank>.json``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import jobkit
import torch

import geomx

LR, MOMENTUM = 0.1, 0.9
SHAPES = [(6,), (3, 40)]  # key 1 spans several slices (the test sets slice_elems)


def gradient(rank: int, step: int, key: int) -> torch.Tensor:
    """Worker ``rank``'s gradient of ``key`` at ``step`` (the test computes the same)."""
    shape = SHAPES[key]
    numel = torch.Size(shape).numel()
    return (torch.arange(numel, dtype=torch.float32) * (rank + 1) * step / 10 + key - rank).reshape(shape)


def attempt(action: Callable[[], Any]) -> dict[str, Any]:
    try:
        action()
    except Exception as exc:
        return {"outcome": type(exc).__name__, "text": str(exc), "key_error": isinstance(exc, KeyError)}
    return {"outcome": "no error", "text": "", "key_error": False}


def main() -> None:
    kv = geomx.kv.create("dist_sync")
    rank = kv.global_rank
    if kv.is_master_worker:
        kv.set_optimizer(geomx.optim.SGD(lr=LR, momentum=MOMENTUM))
    weights = [torch.zeros(shape) for shape in SHAPES]
    kv.init([0, 1], weights)
    grads = [gradient(rank, 1, 0), gradient(rank, 1, 1)]
    report: dict[str, Any] = {"refused": {
        "pull_unknown": attempt(lambda: kv.pull(3, torch.zeros(2))),
        "push_unknown_second": attempt(lambda: kv.push([0, 3], [grads[0], torch.zeros(2)])),
        "push_short": attempt(lambda: kv.push([0, 1], [grads[0]])),
        "pull_short": attempt(lambda: kv.pull([0, 1], weights[:1])),
        "pushpull_short_out": attempt(lambda: kv.pushpull([0, 1], grads, weights[:1])),
    }}
    # MXNet's semantics: a key may be pushed again before its pull, which returns the value after every push
    for step in (1, 2):
        kv.push([0, 1], [gradient(rank, step, 0), gradient(rank, step, 1)])
    kv.pull([0, 1], weights)
    report["after_two_pushes"] = [w.tolist() for w in weights]
    kv.push([0, 1], [gradient(rank, 3, 0), gradient(rank, 3, 1)])
    kv.pull([0, 1], weights)
    report["after_three_pushes"] = [w.tolist() for w in weights]

    def failing_then_fine() -> None:  # the server refuses the first push (its dtype); the second is fine
        kv.push(0, torch.zeros(SHAPES[0], dtype=torch.float64))
        kv.push(0, gradient(rank, 4, 0))
        kv.pull(0, weights[0])

    report["earlier_push_failed"] = attempt(failing_then_fine)
    (jobkit.out_dir(kv.config.run_dir) / f"kv_calls{rank}.json").write_text(json.dumps(report))
    kv.close()


if __name__ == "__main__":
    jobkit.run_and_exit(main)
