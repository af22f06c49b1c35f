"""The quality row ``fsa_bsc``'s arithmetic in one process, for trying what Adam needs under a sparse codec.

Two parties, each the gradient of its half of the quality section's global batch (a collective party of 2 ranks
all-reduces to exactly that); each party's gradient through a per-tensor top-k with error feedback (Bi-Sparse's
exact path: ``k = max(1, int(n * fraction))``, no momentum correction); the global server's sum through its own
top-k with error feedback; every party steps on the answer over the parties. Same model, data, order, rates and
evaluation as the section (``geomx.bench.workers.quality``). It reproduces the real rows (``dense``: 1.6623 against
``fsa``'s 1.6634; ``adamw``: 2.1189 against ``fsa_bsc``'s 2.1241) in ~90 s a try on one core, so the Adam-side
mechanisms below were compared here before one was built (``geomx.torch.FrozenVarianceAdam``); the results are in
benchmarks/README.md ("Bi-Sparse under FSA").

Mechanisms (``mechanism``):

* ``dense``: no codec, torch AdamW (the ``fsa`` row);
* ``adamw``: torch AdamW on the sparse answers (``fsa_bsc``);
* ``frozen``: ``geomx.torch.FrozenVarianceAdam`` (AdamW, variance frozen after ``--freeze-after`` steps) on the
  answers (``--ramp`` for the codec's warm-up: the kept fraction ``fraction ** (step / ramp)`` until ``ramp``);
* ``burst``: AdamW whose variance is fed, where an answer is non-zero after ``n`` steps of zeros, the mean square
  ``(G / n) ** 2`` of the steps the burst stands for (``burst_sum``: ``G ** 2 / n``), and held otherwise;
* ``precond``: each party sends its gradient over the root of its own (dense) AdamW variance; the answer feeds a
  momentum and is the step;
* ``update``: each party runs AdamW on its own gradient and sends the step; the answer is the step.

Usage::

    PYTHONPATH=src python scripts/sparse_adam_replay.py frozen --freeze-after 120 --ramp 600
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch
import torch.nn.functional as F

from geomx.bench.quality_rows import BUDGET
from geomx.bench.workers.quality import global_batches, rank_part, texts
from geomx.torch import FrozenVarianceAdam
from geomx.zoo.charlm import VOCAB, build, evaluate

MECHANISMS = ("dense", "adamw", "frozen", "burst", "burst_sum", "precond", "update")
PARTIES = 2
BETA1, BETA2, EPS, DECAY = 0.9, 0.999, 1e-8, 0.01


class TopK:
    """Per-tensor top-k with error feedback, and the bytes it sent (index and value: 8 bytes a kept element,
    4 a dense one when half or more are kept, as Bi-Sparse sends them)."""

    def __init__(self, fraction: float, ramp: int) -> None:
        self.fraction, self.ramp, self.sent, self.dense = fraction, ramp, 0, 0

    def __call__(self, residual: torch.Tensor, x: torch.Tensor, step: int) -> torch.Tensor:
        residual += x
        flat = residual.view(-1)
        fraction = self.fraction ** (min(step - 1, self.ramp) / self.ramp) if self.ramp else self.fraction
        k = max(1, int(flat.numel() * fraction))
        self.sent += min(8 * k, 4 * flat.numel())
        self.dense += 4 * flat.numel()
        picked = flat.abs().topk(k).indices
        out = torch.zeros_like(flat)
        out[picked] = flat[picked]
        flat[picked] = 0
        return out.view_as(x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mechanism", choices=MECHANISMS)
    parser.add_argument("--fraction", type=float, default=0.01, help="kept each way (Bi-Sparse's threshold)")
    parser.add_argument("--ramp", type=int, default=0, help="the codec's warm-up steps (warmup_steps)")
    parser.add_argument("--freeze-after", type=int, default=120, help="frozen: the steps before the freeze")
    parser.add_argument("--steps", type=int, default=BUDGET.steps)
    args = parser.parse_args()
    torch.set_num_threads(1)
    train, val = texts(BUDGET.max_chars, 64, BUDGET.eval_windows)
    torch.manual_seed(BUDGET.seed)
    model = build(BUDGET.preset)
    params = list(model.parameters())
    inputs, targets = train.tensors()
    zeros = lambda: [torch.zeros_like(p) for p in params]  # noqa: E731
    push, pull, moment, variance, last = [zeros() for _ in range(PARTIES)], zeros(), zeros(), zeros(), zeros()
    own_moment, own_variance = [zeros() for _ in range(PARTIES)], [zeros() for _ in range(PARTIES)]
    adamw = (FrozenVarianceAdam(params, lr=BUDGET.lr, weight_decay=DECAY, decoupled_weight_decay=True,
                                freeze_after=args.freeze_after) if args.mechanism == "frozen"
             else torch.optim.AdamW(params, lr=BUDGET.lr, weight_decay=DECAY))
    codec, started, curve = TopK(args.fraction, args.ramp), time.monotonic(), []
    batches = global_batches(len(train), BUDGET.batch_size * BUDGET.world, args.steps, BUDGET.seed)
    for step, batch in enumerate(batches, 1):
        lr = BUDGET.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * (step - 1) / args.steps)))
        grads = []
        for party in range(PARTIES):
            mine = rank_part(batch, party, PARTIES)
            model.zero_grad(set_to_none=True)
            F.cross_entropy(model(inputs[mine]).reshape(-1, VOCAB), targets[mine].reshape(-1)).backward()
            grads.append([p.grad.clone() for p in params])
        with torch.no_grad():
            if args.mechanism in ("precond", "update"):
                sent = []
                for party in range(PARTIES):
                    out = []
                    for i, p in enumerate(params):
                        g, m, v = grads[party][i], own_moment[party][i], own_variance[party][i]
                        v.mul_(BETA2).addcmul_(g, g, value=1 - BETA2)
                        root = (v / (1 - BETA2 ** step)).sqrt() + EPS
                        if args.mechanism == "precond":
                            x = g / root
                        else:
                            m.lerp_(g, 1 - BETA1)
                            x = -lr * m / (1 - BETA1 ** step) / root - lr * DECAY * p
                        out.append(codec(push[party][i], x, step))
                    sent.append(out)
                for i, p in enumerate(params):
                    answer = codec(pull[i], sum(s[i] for s in sent), step) / PARTIES
                    if args.mechanism == "update":
                        p.add_(answer)
                        continue
                    p.mul_(1 - lr * DECAY)
                    moment[i].lerp_(answer, 1 - BETA1)
                    p.add_(moment[i], alpha=-lr / (1 - BETA1 ** step))
            else:
                mean = [sum(g[i] for g in grads) / PARTIES for i in range(len(params))]
                answers = mean if args.mechanism == "dense" else [
                    codec(pull[i], sum(codec(push[party][i], grads[party][i], step) for party in range(PARTIES)),
                          step) / PARTIES for i in range(len(params))]
                if args.mechanism in ("dense", "adamw", "frozen"):
                    for p, answer in zip(params, answers, strict=True):
                        p.grad = answer
                    for group in adamw.param_groups:
                        group["lr"] = lr
                    adamw.step()
                else:
                    own_step(args, step, lr, params, answers, moment, variance, last)
        if step % 300 == 0 or step == args.steps:
            curve.append((step, round(evaluate(model, val, max(1, BUDGET.eval_windows // 64), 64)[0], 4)))
            print(args.mechanism, *curve[-1], f"{time.monotonic() - started:.0f} s", flush=True)
    print(json.dumps({**vars(args), "val_loss": curve[-1][1], "curve": curve,
                      "bytes_vs_dense": round(codec.sent / max(1, codec.dense), 4)}))


def own_step(args: argparse.Namespace, step: int, lr: float, params: list[torch.Tensor],
             answers: list[torch.Tensor], moment: list[torch.Tensor], variance: list[torch.Tensor],
             last: list[torch.Tensor]) -> None:
    """AdamW on the answers, its variance fed the bursts' per-step squares."""
    for i, p in enumerate(params):
        g = answers[i]
        p.mul_(1 - lr * DECAY)
        moment[i].lerp_(g, 1 - BETA1)
        n = step - last[i]
        released = g != 0
        square = (g / n) ** 2 if args.mechanism == "burst" else g * g / n
        decay = BETA2 ** n
        variance[i] = torch.where(released, decay * variance[i] + (1 - decay) * square, variance[i])
        last[i] = torch.where(released, torch.full_like(last[i], step), last[i])
        held = variance[i] / (1 - BETA2 ** step)
        p.add_(-lr * moment[i] / (1 - BETA1 ** step) / (held.sqrt() + EPS))


if __name__ == "__main__":
    main()
