"""Progress lines and metric records for training scripts: the master worker speaks, the others stay quiet.

With ``every_party=True`` the first worker of every other party records too (its own party's view of the
model: under MixedSync each party holds the global model as of its own last pull), so a bench can take the
slowest party's time. Every record names its ``party``; a script passes ``global_round`` (global rounds
done when the evaluated model was pulled) so "before the first global round" can be told apart.

Usage::

    progress = Progress(kv)
    for epoch in range(epochs):
        ...
        progress.epoch(epoch + 1, epochs, steps=total_steps, losses=losses, accuracy=acc, step_ms=12.5,
                       global_round=total_steps)
    progress.finish(accuracy=acc, steps=total_steps)
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol


class _Reporter(Protocol):
    is_master_worker: bool
    party: str
    rank: int

    def wan_bytes(self) -> int: ...

    def record(self, **metrics: Any) -> None: ...


def party_reporter(kv: Any) -> bool:
    """True on the master worker and on rank 0 of every party but the master's: one evaluator per party.

    Usage: ``if party_reporter(kv): acc = accuracy(model, ...)``.
    """
    if kv.is_master_worker:
        return True
    return bool(kv.rank == 0 and kv.party != kv.config.topology.central)


class Progress:
    """One line per epoch (or round) on the master worker (``every_party``: on each party's first worker),
    also recorded in the run folder."""

    def __init__(self, kv: _Reporter, unit: str = "epoch", every_party: bool = False) -> None:
        self.kv = kv
        self.unit = unit
        self.speaks = party_reporter(kv) if every_party else kv.is_master_worker
        self.started = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def epoch(self, index: int, total: int, *, steps: int, losses: Sequence[float], accuracy: float,
              **extra: float) -> None:
        """Print and record: step count, mean loss, test accuracy, WAN MB so far, elapsed time, ``extra``."""
        if not self.speaks:
            return
        loss = sum(losses) / max(len(losses), 1)
        wan_mb = self.kv.wan_bytes() / 1e6
        shown = "".join(f"  {name.replace('_', ' ')} {value:.4g}" for name, value in extra.items())
        who = "" if self.kv.is_master_worker else f"[{self.kv.party}] "
        print(f"{who}{self.unit} {index}/{total}  step {steps}  loss {loss:.4f}  test acc {accuracy:.4f}  "
              f"WAN {wan_mb:.2f} MB{shown}  elapsed {self.elapsed():.1f} s", flush=True)
        self.kv.record(**{self.unit.replace(" ", "_"): index}, party=self.kv.party, steps=steps, loss=loss,
                       test_accuracy=accuracy, wan_mb=wan_mb, elapsed_s=self.elapsed(), **extra)

    def finish(self, *, accuracy: float, steps: int) -> None:
        if self.kv.is_master_worker:
            print(f"final test accuracy {accuracy:.4f} after {steps} steps in {self.elapsed():.1f} s", flush=True)
