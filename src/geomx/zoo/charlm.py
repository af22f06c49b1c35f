"""A small character-level transformer language model and its text: ``examples/lm.py``'s model, in the package.

The text is the Python standard library's own source code (top-level ``.py`` files, in name order), found at run
time through ``sysconfig``: it ships with every Python installation, nothing is downloaded. The same interpreter
gives the same text (another Python version: another text, so another validation loss).
``examples/lm.py`` trains it with the PyTorch wrapper; the WAN bench's second job (``geomx.bench.wan.lm``) uses it too.

Usage::

    ids = encode(stdlib_text(1_000_000))
    train, val = Windows(ids[:900_000], 64), Windows(ids[900_000:], 64)
    model = CharTransformer(context=64, dim=64, layers=2, heads=4)
    val_loss, accuracy = evaluate(model, val, batches=8, batch_size=32)
    big = build("gpt85m")  # a named shape of ``PRESETS``: GPT-2 small's blocks, about 85M parameters
"""

from __future__ import annotations

import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

VOCAB = 128  # ASCII; anything else becomes '?'


def stdlib_text(max_chars: int) -> str:
    """The standard library's top-level ``.py`` files, in name order, up to ``max_chars`` characters."""
    folder = Path(sysconfig.get_paths()["stdlib"])
    parts: list[str] = []
    total = 0
    for path in sorted(folder.glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        parts.append(text)
        total += len(text)
        if total >= max_chars:
            break
    if total == 0:
        raise FileNotFoundError(f"no Python sources found under {folder}")
    return "".join(parts)[:max_chars]


def encode(text: str) -> torch.Tensor:
    """ASCII codes of ``text`` (int64; anything else becomes '?')."""
    return torch.tensor(list(text.encode("ascii", errors="replace")), dtype=torch.int64).clamp_(max=VOCAB - 1)


class Windows(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Non-overlapping windows of ``context`` characters and the same shifted by one (the targets)."""

    def __init__(self, ids: torch.Tensor, context: int) -> None:
        self.ids = ids
        self.context = context

    def __len__(self) -> int:
        return (len(self.ids) - 1) // self.context

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = index * self.context
        return self.ids[start:start + self.context], self.ids[start + 1:start + self.context + 1]

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """All windows at once: inputs and targets, each (len(self), context)."""
        count = len(self) * self.context
        return self.ids[:count].view(-1, self.context), self.ids[1:count + 1].view(-1, self.context)


class CharTransformer(nn.Module):
    """Token and position embeddings, ``layers`` pre-norm causal transformer blocks, a linear head.

    ``ff`` is the blocks' feed-forward width as a multiple of ``dim``: 2 (the default, the examples' and the earlier
    GPU runs' models), or 4 for GPT-2's blocks. ``CharTransformer(context=256, dim=768, layers=12, heads=12, ff=4)``
    is ``build("gpt85m")``.
    """

    def __init__(self, context: int, dim: int, layers: int, heads: int, ff: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        self.position = nn.Embedding(context, dim)
        self.blocks = nn.ModuleList(nn.TransformerEncoderLayer(dim, heads, ff * dim, dropout=0.0, batch_first=True,
                                                               norm_first=True) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, VOCAB)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(context), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        length = ids.shape[1]
        x = self.embed(ids) + self.position(torch.arange(length, device=ids.device))
        for block in self.blocks:
            x = block(x, src_mask=self.mask[:length, :length], is_causal=True)
        return self.head(self.norm(x))


@dataclass(frozen=True)
class Shape:
    """A character transformer's shape, named in ``PRESETS`` so that a job, a bench and a test mean the same model
    by the same word (``build(PRESETS["gpt85m"])`` or ``build("gpt85m")``)."""

    dim: int
    layers: int
    heads: int
    context: int
    ff: int = 2  # the feed-forward width as a multiple of dim
    summary: str = ""  # one line: what the shape is for


PRESETS: dict[str, Shape] = {
    "tiny": Shape(64, 2, 4, 64, 2, "examples/lm.py's default shape: 87.7K parameters, for the CPU"),
    "gpt57m": Shape(768, 12, 12, 256, 2, "57.1M parameters: the 12-block, ff-2x model of the earlier GPU runs"),
    "gpt85m": Shape(768, 12, 12, 256, 4, "85.4M parameters: GPT-2 small's blocks (12 x width 768, ff 4x)"),
    "gpt43m": Shape(768, 6, 12, 256, 4, "42.9M parameters: gpt85m at half its depth (6 blocks), half its size"),
}


def build(preset: str | Shape) -> CharTransformer:
    """A ``CharTransformer`` of a named preset (a key of ``PRESETS``) or of a ``Shape``, on the CPU.

    Usage: ``model = build("gpt85m").to("cuda")``. An unknown name raises ``ValueError`` naming the valid ones.
    """
    if isinstance(preset, str):
        if preset not in PRESETS:
            raise ValueError(f"unknown CharTransformer preset {preset!r}: valid presets are {', '.join(PRESETS)}")
        preset = PRESETS[preset]
    return CharTransformer(context=preset.context, dim=preset.dim, layers=preset.layers, heads=preset.heads,
                           ff=preset.ff)


def next_char_loss(model: nn.Module, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of the next character over every position of the batch."""
    return F.cross_entropy(model(ids).reshape(-1, VOCAB), targets.reshape(-1))


def evaluate(model: nn.Module, val: Dataset[tuple[torch.Tensor, torch.Tensor]], batches: int,
             batch_size: int) -> tuple[float, float]:
    """Mean loss and next-character accuracy on the first ``batches`` validation batches (on the model's device)."""
    model.eval()
    device = next(model.parameters()).device
    losses, correct, count = [], 0, 0
    with torch.no_grad():
        for _, (x, y) in zip(range(batches), DataLoader(val, batch_size=batch_size), strict=False):
            x, y = x.to(device), y.to(device)
            logits = model(x).float().reshape(-1, VOCAB)  # a bfloat16 model's loss, measured in float32
            losses.append(float(F.cross_entropy(logits, y.reshape(-1))))
            correct += int((logits.argmax(dim=1) == y.reshape(-1)).sum())
            count += y.numel()
    model.train()
    return sum(losses) / len(losses), correct / count
