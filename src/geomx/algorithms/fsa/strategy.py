"""FSA's worker side in the PyTorch wrapper: gradients leave from autograd hooks, every round needs every key.

Two strategies, chosen by the plan: ``ServerOptimizerStep`` (the global servers run the optimizer and answer
with new weights, landed lazily before the forward that needs them) and ``LocalOptimizerStep`` (the servers
answer with the gradient sum; every worker steps its own torch optimizer on the mean). MixedSync, SSP and
DCASGD differ only on the servers: their workers run these too.

Usage::

    strategy = ServerOptimizerStep(loop)      # loop: the wrapper (geomx.core.strategy.Loop)
    strategy.step()                           # after backward
"""

from __future__ import annotations

import time

import torch

from ...config import Mode
from ...core.strategy import AveragedStep, Loop, WorkerStrategy


class ServerOptimizerStep(WorkerStrategy):
    """Push every gradient as backward makes it; the answers (new weights) land before the next forward."""

    pushes_gradients = True
    same_model_everywhere = True  # every party's answers are the same round's (under FSA's synchronous policy)

    def steps_of(self, rounds: int) -> int | None:
        """A synchronous top tier's round is a step of every party. An asynchronous one (MixedSync, DCASGD) applies
        each party's push as a round of its own, so the least advanced slice's rounds are about the parties' steps
        summed (every worker's, in a flat job): each resumes at their mean (their own steps are not recorded)."""
        kv = self.loop.kv
        policy = getattr(kv, "policy", None)
        if policy is None or policy.synchronous:
            return rounds
        topology = kv.config.topology
        return rounds // max(1, kv.num_all_workers if topology.mode is Mode.FLAT else len(topology.parties))

    def step(self) -> None:
        self.push_missing()
        self.after_pushes()

    def average_gradients(self) -> None:
        raise RuntimeError(refused_average(self.loop))

    def after_pushes(self) -> None:
        """Every key of the step is pushed: its answer is the new weights, landed lazily."""
        loop = self.loop
        loop.pending.update(loop.pushed)
        loop.pushed.clear()

    def push_missing(self) -> None:
        """FSA rounds need every worker's push of every key: parameters without a gradient push zeros."""
        loop = self.loop
        for key in loop.trained:
            if key not in loop.pushed:
                warn_no_gradient(loop, key)
                loop.await_keys([key])
                self.on_gradient(key, torch.zeros_like(loop.params[key]))


class LocalOptimizerStep(AveragedStep, ServerOptimizerStep):
    """The answers are gradient sums: their mean goes into ``.grad`` and the wrapped optimizer steps here."""

    keeps_model = True  # the servers hold gradient sums: the model and the optimizer state are the workers'

    def average(self) -> None:
        self.push_missing()
        loop = self.loop
        loop.pushed.clear()
        started = time.monotonic()
        scale = 1.0 / loop.kv.num_all_workers
        for key in loop.trained:
            param = loop.params[key]
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            loop.kv.pull(key, param.grad, priority=loop.priority[key])
            param.grad.mul_(scale)
        loop.waited(time.monotonic() - started)


def warn_no_gradient(loop: Loop, key: int) -> None:
    """Say once that parameter ``key`` had no gradient in a step, so FSA pushes zeros for it (its rounds need every
    key). Usage: ``warn_no_gradient(loop, key)`` beside the zeros pushed."""
    loop.warn_once(f"nograd{key}", f"parameter {loop.names[key]!r} had no gradient in a step: pushing zeros for it")


def refused_average(loop: Loop) -> str:
    """Why ``average_gradients`` cannot be: the global servers apply the gradients pushed during backward."""
    return (f"{loop.kv.name}: the global servers run the optimizer on the gradients pushed during backward, so no "
            "worker holds the averaged gradients before they are applied (nor can clip them, or unscale them for a "
            "GradScaler): set "
            "training.server_optimizer: none (FSA with the optimizer on every worker; MixedSync and SSP need the "
            "servers'), or use HFA")
