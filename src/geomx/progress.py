"""Progress lines and metric records for training scripts: the master worker speaks, the others stay quiet.

Usage::

    progress = Progress(kv)
    for epoch in range(epochs):
        ...
        progress.epoch(epoch + 1, epochs, steps=total_steps, losses=losses, accuracy=acc, step_ms=12.5)
    progress.finish(accuracy=acc, steps=total_steps)
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol


class _Reporter(Protocol):
    is_master_worker: bool

    def wan_bytes(self) -> int: ...

    def record(self, **metrics: Any) -> None: ...


class Progress:
    """One line per epoch (or round) on the master worker, also recorded in the run folder."""

    def __init__(self, kv: _Reporter, unit: str = "epoch") -> None:
        self.kv = kv
        self.unit = unit
        self.started = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def epoch(self, index: int, total: int, *, steps: int, losses: Sequence[float], accuracy: float,
              **extra: float) -> None:
        """Print and record: step count, mean loss, test accuracy, WAN MB so far, elapsed time, ``extra``."""
        if not self.kv.is_master_worker:
            return
        loss = sum(losses) / max(len(losses), 1)
        wan_mb = self.kv.wan_bytes() / 1e6
        shown = "".join(f"  {name.replace('_', ' ')} {value:.4g}" for name, value in extra.items())
        print(f"{self.unit} {index}/{total}  step {steps}  loss {loss:.4f}  test acc {accuracy:.4f}  "
              f"WAN {wan_mb:.2f} MB{shown}  elapsed {self.elapsed():.1f} s", flush=True)
        self.kv.record(**{self.unit: index}, steps=steps, loss=loss, test_accuracy=accuracy, wan_mb=wan_mb,
                       elapsed_s=self.elapsed(), **extra)

    def finish(self, *, accuracy: float, steps: int) -> None:
        if self.kv.is_master_worker:
            print(f"final test accuracy {accuracy:.4f} after {steps} steps in {self.elapsed():.1f} s", flush=True)
