"""geomx's PyTorch front end: keep your training loop, wrap the optimizer, train across data centers.

Inside this package ``import torch`` still means PyTorch (absolute imports). The synchronization
algorithm, WAN codec and P3 come from the topology's ``training`` block or GEOMX_* variables.

``optimizer`` (``DistributedOptimizer``: the mechanism), ``plan`` (which way the loop runs, decided once), ``hooks``
(the hooks on the model: priorities, P3's waits), ``data`` (each worker's part of the data), ``amp`` (a
``GradScaler`` under the wrapper), ``join`` (uneven loops in a collective party), ``loop_checks`` (what a DDP loop
may do that the wrapper cannot carry out, named), ``signature`` (a model's fingerprint, checked at start),
``digest`` (model digests for the status page), ``checkpoint`` (a worker's own checkpoints), ``metrics``
(per-step metrics in the run folder), ``progress`` (progress bars on a terminal), ``frozen_variance`` (Adam whose
variance freezes after a warm-up: Adam under a sparse WAN codec), ``start`` (a configuration that cannot start, said in
one line by the entry points; ``init_process_group`` for a script's own DDP, in a ``lan: collective`` party only).

Usage::

    import geomx.torch as gx
    train_set = gx.shard(train_set)                          # this worker's part, across all parties
    opt = gx.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-3), model)
    ...                                                      # the loop: zero_grad, backward, step
    opt.close()
"""

from __future__ import annotations

from .data import ShardSampler, local_rank, shard, worker_place
from .frozen_variance import FrozenVarianceAdam
from .optimizer import DistributedOptimizer, ModelMismatchError
from .plan import Plan, Strategy, make_plan, translate
from .progress import progress
from .start import init_process_group

__all__ = [
           "DistributedOptimizer",
           "FrozenVarianceAdam",
           "ModelMismatchError",
           "Plan",
           "ShardSampler",
           "Strategy",
           "init_process_group",
           "local_rank",
           "make_plan",
           "progress",
           "shard",
           "translate",
           "worker_place",
]
