"""The quality section's budget and rows: what every row shares (``Budget``) and how each row differs
(``QualityRow``), in one place; ``geomx.bench.quality`` runs them.

Usage::

    from geomx.bench.quality_rows import BUDGET, ROWS
    [row.name for row in ROWS]          # single, ddp, fsa, diloco, ...
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Budget:
    """The model, the token budget and the settings every row shares: the one place they are chosen.

    Why this size: ``tiny`` (87.7K parameters, context 64, width 64, 2 blocks) takes ~19 ms for a rank's step of
    16 windows on one core, so the single row's 1500 steps take ~2 minutes on the loaded 2-core machine and a geomx
    row's 4 ranks about as long: ``--quick``'s 6 rows fit in 40 minutes with room for a load of 10, the 15 rows in
    about an hour. A larger model (dim 96, 3 blocks: 255K) takes 2-2.6x longer a step and would not fit. 1500
    steps of 64 windows (6.1M tokens, 1.7 passes over 3.6M training characters): at 500 steps the single row was
    still falling fast (1.79 nats per character from ln 128 = 4.85), a budget where an algorithm's early lag
    would count more than what it converges to. AdamW from 3e-3 (``examples/lm.py``'s rate) down a cosine to a
    tenth at the last step, for every row whose optimizer runs on the workers: at a constant 3e-3 the reference's
    validation loss jumped by +-0.05 from one evaluation to the next, more than the 0.5% the goals compare.
    MixedSync and SSP run Adam (only Adam translates) on the global servers at a constant 3e-3: a worker's rate
    would not reach them.

    DiLoCo at this budget: H = K1 x K2 = 25 inner steps, 60 outer steps (the paper's H = 500 would leave 3), and
    DiLoCo's outer Nesterov at lr 0.7 with momentum 0.5, not 0.9 (``OUTER``; the tries are in benchmarks/README.md):
    0.9 remembers ~10 of the 60 outer steps and overshot (1.040 of ddp's loss; 1.104 at H = 10), while plain
    averaging ended 1.034 at both H = 25 and H = 5, so the gap is not the replicas' drift but the average of two
    AdamW updates being shorter than one on the whole batch; 0.7 / (1 - 0.5) = 1.4 times the average restores it.
    In a collective party the inner steps are data-parallel, as a DiLoCo replica of 2 ranks, so only K1 x K2
    matters; K2 = 5 lets streaming cut the model into 5 fragments.
    """

    preset: str = "tiny"
    steps: int = 1500
    batch_size: int = 16  # windows of 64 characters per rank per step: the global batch is 64 windows
    world: int = 4  # 2 parties x 2 ranks; single trains on the global batch
    eval_every: int = 100  # a multiple of K1 x K2: the distributed rows evaluate a global model
    eval_windows: int = 512  # 512 validation windows (32K characters) spread over the held-out text, every row's
    lr: float = 3e-3
    max_chars: int = 4_000_000  # of the standard library's text: 3.6M training characters, 1.7 passes
    hfa: tuple[int, int] = (5, 5)  # K1, K2: an outer step every 25 inner steps
    seed: int = 0
    timeout_s: float = 900.0  # one row's job

    @property
    def outer_every(self) -> int:
        return self.hfa[0] * self.hfa[1]


BUDGET = Budget()


@dataclass(frozen=True)
class QualityRow:
    """One row: how it runs (``single``, ``ddp`` or ``geomx``), its topology's ``training`` block and whether HFA
    is on (then a record's bytes are per outer step, else per step)."""

    name: str
    kind: str = "geomx"
    training: dict[str, Any] = field(default_factory=dict)
    hfa: bool = False
    optimizer: str = "adamw"
    schedule: str = "cosine"  # constant where the global servers run the optimizer (a worker's rate would not reach it)
    lr: float | None = None  # the workers' rate where it is not the budget's (a try with SGD on the workers)
    freeze_after: int | None = None  # frozen_adamw: the steps before its variance freezes


OUTER = {"server_optimizer": {"type": "outer_nesterov", "lr": 0.7, "momentum": 0.5}}  # Budget's docstring says why
PAPER = {"server_optimizer": "outer_nesterov"}  # lr 0.7, momentum 0.9: streaming's (at 0.5: 1.7151, against 1.6732)
# Residual codecs on DiLoCo's deltas: the outer step is plain averaging (outer SGD, lr 1, no momentum), SparseLoCo's
# setting, where the error feedback stands for the outer momentum. With Nesterov 0.9 on top, both diverged at 500
# steps (validation loss 17.6 with Bi-Sparse, 7.47 with sparse2bit, from 3.3 and 2.8 at step 200); averaged: 2.47, 2.41
AVERAGE = {"server_optimizer": {"type": "outer_nesterov", "lr": 1.0, "momentum": 0.0}}
BSC = {"type": "bsc", "threshold": 0.01}  # Bi-Sparse, 1% of the elements each way
# the answers keep two parties' union (4%): re-sparsified at 2% they held back half of it (H = 5: 1.987, 1.914 dense)
SPARSE2BIT = {"type": "sparse2bit", "density": 0.02, "chunk": 4096, "pull_density": 0.04}
ROWS: tuple[QualityRow, ...] = (
    QualityRow("single", "single"),
    QualityRow("ddp", "ddp"),
    QualityRow("fsa"),
    QualityRow("diloco", training=OUTER, hfa=True),
    QualityRow("streaming", training={**PAPER, "fragments": 5, "fragment_delay": 1, "fragment_alpha": 0.5},
               hfa=True),
    QualityRow("diloco_int8", training={**OUTER, "compression": {"type": "int8", "block": 256}}, hfa=True),
    QualityRow("diloco_bsc", training={**AVERAGE, "compression": BSC}, hfa=True),
    QualityRow("diloco_sparse2bit", training={**AVERAGE, "compression": SPARSE2BIT}, hfa=True),
    QualityRow("fsa_int8", training={"compression": {"type": "int8", "block": 256}}),
    QualityRow("fsa_bsc", training={"compression": BSC}),
    # the codec's warm-up (1% from step 800) and the workers' AdamW variance frozen at 120 (FrozenVarianceAdam)
    QualityRow("fsa_bsc_frozen", training={"compression": {**BSC, "warmup_steps": 800}}, optimizer="frozen_adamw",
               freeze_after=120),
    QualityRow("mixed", training={"sync": "dist_async"}, optimizer="adam", schedule="constant"),
    QualityRow("mixed_dcasgd", training={"sync": "dist_async",
                                         "server_optimizer": {"type": "dcasgd", "lr": 0.3, "momentum": 0.0}},
               schedule="constant"),
    # the compensation alone, on the optimizer ``mixed`` runs (DCASGD's row changes the optimizer to SGD as well)
    QualityRow("mixed_dcadam", training={"sync": "dist_async", "server_optimizer": {"type": "dcadam", "lr": 3e-3}},
               optimizer="adam", schedule="constant"),
    QualityRow("ssp", training={"sync": "dist_ssp", "staleness": 2}, optimizer="adam", schedule="constant"),
)
