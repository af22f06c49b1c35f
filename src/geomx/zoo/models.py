"""Small real models for the examples, tests and benchmarks.

Usage::

    model = DigitsCNN()
    logits = model(images)          # images: (N, 1, 8, 8)
    mlp = DigitsMLP()               # the seeds' Bi-Sparse loop's model: 64-1024-1024-10
"""

from __future__ import annotations

import torch
from torch import nn


class DigitsCNN(nn.Module):
    """Two conv layers and two dense layers for 8x8 digits (about 30k parameters)."""

    def __init__(self, channels: int = 16, hidden: int = 64, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, channels, 3, padding=1), nn.ReLU(),
            nn.Conv2d(channels, 2 * channels, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(2 * channels * 16, hidden), nn.ReLU(),
                                        nn.Linear(hidden, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class DigitsMLP(nn.Module):
    """A 64-1024-1024-10 perceptron for 8x8 digits (1.1M parameters, 1M in the middle layer).

    The model of the issue's port of GeoMX's Bi-Sparse loop: large tensors dominate, so top-k decides.
    """

    def __init__(self, hidden: int = 1024, classes: int = 10) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Flatten(), nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                                    nn.ReLU(), nn.Linear(hidden, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def accuracy(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> float:
    """Fraction of correct predictions, computed without gradients."""
    with torch.no_grad():
        return float((model(images).argmax(dim=1) == labels).float().mean())
