"""What the PyTorch wrapper's ``step()`` runs, as two enums: the plan's mode and the party's LAN tier.

``geomx.torch.plan`` decides the ``Strategy`` from the training block; the wrapper reads the ``Lan`` from the
topology and the model; ``geomx.algorithms.registry.strategy_class`` takes the pair. They live here, below the
wrapper and beside the registry, so that both may import them (the servers never import torch).

Usage::

    strategy_class(Strategy.HFA, Lan.COLLECTIVE)    # geomx.algorithms.hfa.collective.CollectivePeriodicAverage
"""

from __future__ import annotations

import enum


class Strategy(enum.Enum):
    """The plan's mode (``geomx.torch.plan``'s docstring says which training block picks which)."""

    SERVER = "server optimizer"
    LOCAL = "local optimizer on averaged gradients"
    HFA = "hierarchical frequency aggregation"
    ESYNC = "ESync"


class Lan(enum.Enum):
    """How a party's workers meet inside their data center."""

    SERVER = "lan: server, a local server sums the workers' pushes"
    COLLECTIVE = "lan: collective, the ranks are one torch.distributed group and each holds the whole model"
    SHARDED = "lan: collective, the script sharded the model over the ranks with FSDP2 (fully_shard)"
