"""The WAN bench's second job: ``examples/lm.py``'s character transformer to a validation-loss target.

The model is ``geomx.zoo.charlm.CharTransformer`` (context 64, width ``DIM``, ``LAYERS`` pre-norm blocks, 4 heads:
``PARAMS`` parameters, about 1.7 MB of fp32 gradients per step), the text the first ``MAX_CHARS`` characters of
the standard library's sources (90% training windows, the last 10% validation; it ships with Python). Every
system uses the same 4-way split of the training windows (rank r: every 4th window from r), batch 32, Adam at
a constant lr 3e-3 (the inner optimizer everywhere: DDP's, the local steps of PostLocalSGD / DiLoCo / HFA, and
geomx FSA's workers stepping on the summed gradient), seed-0 initial weights. The job's evaluation is the
validation loss (mean next-character cross-entropy, nats) on the first ``EVAL_WINDOWS`` validation windows;
lower is better, and the target is DDP-on-loopback's final validation loss plus ``MARGIN``.

Usage::

    from geomx.bench.wan.jobs import job
    lm = job("lm")
    model = lm.make_model(); shard, val, steps = lm.shard_and_test(rank, 4)
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ...zoo.charlm import CharTransformer, Windows, encode, next_char_loss, stdlib_text
from ...zoo.data import Dataset, steps_per_epoch
from .job import BATCH, SEED, Job, calibrate

CONTEXT = 64
DIM = 128
LAYERS = 2
HEADS = 4
LR = 3e-3
MAX_CHARS = 600_000
EVAL_WINDOWS = 256
MARGIN = 0.05  # nats of validation loss above DDP-on-loopback's final one
EPOCHS = 2


def make_model() -> nn.Module:
    """The transformer with seed-0 weights (every rank builds the same initial model)."""
    torch.manual_seed(SEED)
    return CharTransformer(CONTEXT, DIM, LAYERS, HEADS)


def make_optimizer(params: Any, residual_codec: bool = False) -> torch.optim.Optimizer:
    """Adam at a constant lr (its own moment estimates, with or without a residual codec on the WAN)."""
    return torch.optim.Adam(params, lr=LR)


def text_split(max_chars: int = MAX_CHARS) -> tuple[Dataset, Dataset]:
    """Training and validation windows as ``Dataset`` (inputs in ``images``, next characters in ``labels``)."""
    ids = encode(stdlib_text(max_chars))
    cut = int(len(ids) * 0.9)
    train, val = Windows(ids[:cut], CONTEXT).tensors(), Windows(ids[cut:], CONTEXT).tensors()
    return Dataset(*train), Dataset(val[0][:EVAL_WINDOWS], val[1][:EVAL_WINDOWS])


def shard_and_test(rank: int, world: int) -> tuple[Dataset, Dataset, int]:
    """This rank's training windows, the validation windows and the steps per epoch (equal for every rank)."""
    train, val = text_split()
    return train.shard(rank, world), val, steps_per_epoch(len(train), world, BATCH)


def val_loss(model: nn.Module, val: Dataset) -> float:
    """Mean next-character cross-entropy over the validation windows (no gradients, eval mode)."""
    model.eval()
    with torch.no_grad():
        value = float(next_char_loss(model, val.images, val.labels))
    model.train()
    return value


def calibrate_step_s() -> float:
    """Median seconds of one forward + backward + Adam step of this job, with no communication."""
    return calibrate(make_model, make_optimizer, lambda: (torch.randint(0, 128, (BATCH, CONTEXT)),) * 2,
                     next_char_loss)


LM = Job(name="lm", title=f"char transformer (lm.py) {LAYERS}x{DIM}, context {CONTEXT}", metric="val_loss",
         higher_is_better=False, margin=MARGIN, epochs=EPOCHS, codec_momentum=0.0, make_model=make_model,
         make_optimizer=make_optimizer, shard_and_test=shard_and_test, loss_of=next_char_loss, evaluate=val_loss,
         calibrate_step_s=calibrate_step_s)
