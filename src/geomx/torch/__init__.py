"""geomx's PyTorch front end: keep your training loop, wrap the optimizer, train across data centers.

Inside this package ``import torch`` still means PyTorch (absolute imports). The synchronization
algorithm, WAN codec and P3 come from the topology's ``training`` block or GEOMX_* variables.

Usage::

    import geomx.torch as gx
    train_set = gx.shard(train_set)                          # this worker's part, across all parties
    opt = gx.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-3), model)
    ...                                                      # the loop: zero_grad, backward, step
    opt.close()
"""

from __future__ import annotations

from .data import ShardSampler, local_rank, shard, worker_place
from .optimizer import DistributedOptimizer, ModelMismatchError
from .plan import Plan, Strategy, make_plan, translate
from .progress import progress

__all__ = [
           "DistributedOptimizer",
           "ModelMismatchError",
           "Plan",
           "ShardSampler",
           "Strategy",
           "local_rank",
           "make_plan",
           "progress",
           "shard",
           "translate",
           "worker_place",
]
