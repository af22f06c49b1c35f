"""Integration worker: torchft's mocked DiLoCo model (its ``diloco_regression_test``) under geomx's wrapper.

Two layers, each one 1x1 weight of ones; every step's gradient is exactly 2 (the loss ``2 * sum of the weights``),
and the inner optimizer is SGD with lr 1, so each inner step is ``p -= 2``, as torchft's mock optimizer. The
algorithm comes from the topology (HFA, streaming). Saves each step's weights (after the step's answer landed) as
``history``, shape (steps + 1, 2), to ``$GEOMX_RUN_DIR/out/worker<global rank>.*``.
"""

from __future__ import annotations

import argparse

import jobkit
import torch
from torch import nn

import geomx.torch as gx


class Mock(nn.Module):
    """Two 1x1 layers of ones; the forward is the loss (its gradient is 2 for every weight)."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(1, 1, bias=False) for _ in range(2))
        with torch.no_grad():
            for layer in self.layers:
                layer.weight.fill_(1.0)

    def forward(self) -> torch.Tensor:
        return 2 * sum(layer.weight.sum() for layer in self.layers)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=15)
    args = parser.parse_args()
    rank, _ = gx.worker_place()
    model = Mock()
    opt = gx.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0), model)

    def weights() -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    history = [weights()]
    for _ in range(args.steps):
        opt.zero_grad()
        model().backward()
        opt.step()
        opt.synchronize()  # the step's answer in the weights before they are read
        history.append(weights())
    opt.close()
    jobkit.save_worker_output(opt.kv.config.run_dir, rank, {"history": [torch.stack(history)]},
                              {"mode": opt.plan.mode.name})


if __name__ == "__main__":
    jobkit.run_and_exit(main)
