"""Each worker's part of the data, across every party: equal sizes, disjoint, covering the data set.

Synchronous algorithms need every worker to run the same number of steps, so shards are padded to equal
length (by wrapping around to the first samples, as ``torch.utils.data.DistributedSampler`` does). The
worker's place among all workers of all parties comes from the launcher's environment.

Usage::

    train = gx.shard(train_dataset)                                  # a torch Subset
    loader = DataLoader(train_dataset, batch_size=32, sampler=gx.ShardSampler(train_dataset, shuffle=True))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sized
from typing import Any

import torch
from torch.utils.data import Dataset, Sampler, Subset

from ..config import ConfigError, node_config
from .start import refuses_config


@refuses_config  # (this module's entry points read the job's configuration: a bad one is said in one line)
def worker_place() -> tuple[int, int]:
    """(global rank, number of workers of all parties) of this process, from the launcher's environment."""
    config = node_config()
    if config.rank is None and config.torchrun is not None:  # a collective party's rank under its own torchrun
        config = dataclasses.replace(config, rank=config.torchrun.rank)
    if config.rank is None:
        raise ConfigError("this worker has no rank in its environment (GEOMX_RANK): start it with `geomx "
                          "launch`, or pass rank= and num_workers= explicitly")
    offset = config.worker_offset
    if offset is None:
        offset = config.topology.worker_offset(config.party)
    return offset + config.rank, config.topology.num_all_workers


@refuses_config
def local_rank() -> int:
    """This worker's place on its host, to pick its GPU: torchrun's ``LOCAL_RANK`` in a collective party, else its
    rank within its party (a party's workers are started together on one host by ``geomx launch``).

    Usage: ``torch.cuda.set_device(gx.local_rank() % torch.cuda.device_count())``
    """
    config = node_config()
    if config.torchrun is not None:
        return config.torchrun.local_rank
    if config.rank is None:
        raise ConfigError("this worker has no rank in its environment (GEOMX_RANK): start it with `geomx launch`")
    return config.rank


def shard_indices(length: int, rank: int, num_workers: int, seed: int | None = None) -> list[int]:
    """This worker's sample indices: every ``num_workers``-th of a (seeded, shuffled) padded order."""
    if num_workers < 1 or not 0 <= rank < num_workers:
        raise ValueError(f"rank {rank} is outside 0..{num_workers - 1}")
    if length < 1:
        raise ValueError("cannot shard an empty data set")
    order = list(range(length))
    if seed is not None:
        order = torch.randperm(length, generator=torch.Generator().manual_seed(seed)).tolist()
    padded = -(-length // num_workers) * num_workers
    extra = padded - length
    order += (order * (extra // length + 1))[:extra]
    return order[rank::num_workers]


def _place(rank: int | None, num_workers: int | None) -> tuple[int, int]:
    if rank is None or num_workers is None:
        found_rank, found_count = worker_place()
        return (found_rank if rank is None else rank), (found_count if num_workers is None else num_workers)
    return rank, num_workers


@refuses_config
def shard(dataset: Dataset[Any], *, rank: int | None = None, num_workers: int | None = None,
          seed: int | None = None) -> Subset[Any]:
    """This worker's part of ``dataset`` (a Subset). ``seed`` shuffles once before cutting."""
    if not isinstance(dataset, Sized):
        raise TypeError(f"shard needs a data set with a length, got {type(dataset).__name__}")
    rank, num_workers = _place(rank, num_workers)
    return Subset(dataset, shard_indices(len(dataset), rank, num_workers, seed))


class ShardSampler(Sampler[int]):
    """A DataLoader sampler yielding this worker's indices; reshuffled per epoch (call ``set_epoch``)."""

    @refuses_config
    def __init__(self, dataset: Sized, *, shuffle: bool = True, seed: int = 0, rank: int | None = None,
                 num_workers: int | None = None) -> None:
        self.length = len(dataset)
        self.rank, self.num_workers = _place(rank, num_workers)
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        seed = self.seed * 100_003 + self.epoch if self.shuffle else None
        return iter(shard_indices(self.length, self.rank, self.num_workers, seed))

    def __len__(self) -> int:
        return -(-self.length // self.num_workers)
