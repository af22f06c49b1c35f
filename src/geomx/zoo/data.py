"""Real data that ships inside geomx itself: the UCI handwritten digits (1797 8x8 images, 16 grey levels).

``digits.npz`` beside this module holds the copy scikit-learn ships (``sklearn.datasets.load_digits``: the
images as uint8 0..16 and the labels, 45 KB; a unit test checks it against scikit-learn's), read with numpy: a
worker that loaded it through scikit-learn paid about 1.5 CPU-seconds importing scikit-learn, more than its
training on the digits takes in a short job.

Usage::

    train, test = digits_split()
    shard = train.shard(global_rank, num_all_workers)
    for x, y in shard.batches(batch_size=32, epoch=0): ...
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources

import numpy as np
import torch


@dataclass(frozen=True)
class Dataset:
    """Images (N, 1, 8, 8) scaled to [0, 1] and integer labels (N,)."""

    images: torch.Tensor
    labels: torch.Tensor

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def shard(self, index: int, count: int) -> Dataset:
        """Every ``count``-th sample starting at ``index``: disjoint shards covering the data."""
        if not 0 <= index < count:
            raise ValueError(f"shard index {index} outside 0..{count - 1}")
        return Dataset(self.images[index::count], self.labels[index::count])

    def batches(self, batch_size: int, epoch: int, steps: int | None = None,
                seed: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Shuffled full batches (the last partial batch is dropped), ``steps`` of them at most."""
        generator = torch.Generator().manual_seed(seed * 100_003 + epoch)
        order = torch.randperm(len(self), generator=generator)
        available = len(self) // batch_size
        for step in range(available if steps is None else min(steps, available)):
            index = order[step * batch_size:(step + 1) * batch_size]
            yield self.images[index], self.labels[index]


def digits_split(test_fraction: float = 0.2, seed: int = 0) -> tuple[Dataset, Dataset]:
    """The digits data set, split into fixed train and test parts."""
    with resources.files("geomx.zoo").joinpath("digits.npz").open("rb") as handle, np.load(handle) as raw:
        images = torch.tensor(raw["images"], dtype=torch.float32).unsqueeze(1) / 16.0
        labels = torch.tensor(raw["labels"], dtype=torch.int64)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    cut = int(len(labels) * (1 - test_fraction))
    train, test = order[:cut], order[cut:]
    return Dataset(images[train], labels[train]), Dataset(images[test], labels[test])


def steps_per_epoch(train_size: int, num_shards: int, batch_size: int) -> int:
    """Full batches every shard can make: the same count for all workers (FSA needs equal rounds)."""
    smallest = train_size // num_shards
    steps = smallest // batch_size
    if steps < 1:
        raise ValueError(f"{train_size} samples over {num_shards} workers cannot fill a batch of {batch_size}")
    return steps
