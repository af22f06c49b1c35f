"""Per-step metrics of a wrapped training loop, as JSON lines in the run folder (``geomx report`` plots them).

Every ``every`` steps a worker appends one record to ``RUN/metrics/<worker>.jsonl``: ``step`` (the job's step:
a resumed run's count goes on from ``opt.start_step``), ``time``, ``elapsed_s`` (since this run's start),
``step_s`` (mean wall time per step since the last record), ``loss`` (mean of the losses the script logged since
then), ``lan_bytes`` and ``wan_bytes`` (this worker's own traffic, both directions), ``net_wait_s`` (cumulative
seconds this run's loop was blocked waiting on the network). The master worker adds
``wan_bytes_total``: every byte that crossed the WAN in the whole job since this run's global servers started,
read in the background from them (no step waits for it). ``log(accuracy=...)`` writes a record at once. With a
``TensorBoardSink`` every numeric field of every record also becomes a TensorBoard scalar at its step.

Usage::

    recorder = StepRecorder(kv, every=10, sink=TensorBoardSink(run_dir / "tensorboard" / "dc0_worker0"))
    recorder.step(net_wait_s=0.02)
    recorder.log(loss=0.7)
    recorder.close()
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger("geomx.torch")


class _Pulse(Protocol):
    def note(self, *, step: int | None = None, busy: float | None = None) -> None: ...


class _Store(Protocol):
    is_master_worker: bool

    def counters(self) -> dict[str, Any]: ...

    def wan_bytes(self) -> int: ...

    def record(self, **metrics: Any) -> None: ...

    @property
    def pulse(self) -> _Pulse: ...


class WanMeter:
    """Polls the job's WAN byte total from a background thread; ``latest`` never blocks."""

    def __init__(self, kv: _Store, interval_s: float = 1.0) -> None:
        self.kv = kv
        self.interval_s = interval_s
        self.latest: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="geomx-wan-meter", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                self.latest = self.kv.wan_bytes()
            except Exception as exc:  # the job is ending; the last value stands
                log.debug("WAN meter stopped: %s", exc)
                return
            if self._stop.wait(self.interval_s):
                return

    def stop(self) -> int | None:
        """Stop polling; one last reading (None if the servers no longer answer)."""
        self._stop.set()
        self._thread.join(timeout=30)
        try:
            self.latest = self.kv.wan_bytes()
        except Exception as exc:
            log.debug("last WAN reading failed: %s", exc)
        return self.latest


class TensorBoardSink:
    """Writes metrics records as TensorBoard scalars (tensorboardX's event files; no TensorFlow needed).

    Usage: ``sink = TensorBoardSink(Path("runs/x/tensorboard/dc0_worker0")); sink({"step": 10, "loss": 0.7})``,
    then ``tensorboard --logdir runs/x/tensorboard``.
    """

    SKIPPED = frozenset({"step", "time"})

    def __init__(self, folder: Path) -> None:
        try:
            from tensorboardX import SummaryWriter
        except ImportError:
            raise RuntimeError("training.tensorboard (GEOMX_TENSORBOARD) needs the tensorboardX package: "
                               "pip install 'geomx[tensorboard]'") from None
        folder.mkdir(parents=True, exist_ok=True)
        self._writer = SummaryWriter(logdir=str(folder))

    def __call__(self, record: dict[str, Any]) -> None:
        step = int(record.get("step", 0))
        for name, value in record.items():
            if name not in self.SKIPPED and isinstance(value, (int, float)) and not isinstance(value, bool):
                self._writer.add_scalar(name, float(value), global_step=step)

    def close(self) -> None:
        self._writer.close()


def _traffic(counters: dict[str, Any], link: str) -> int:
    entry = counters.get(link, {})
    return int(entry.get("sent", 0)) + int(entry.get("recv", 0))


class StepRecorder:
    """Counts steps and network waits; writes a metrics record every ``every`` steps.

    ``start``: the job's step this worker starts at (``opt.start_step``: a resumed job's checkpoint step). The
    records, the TensorBoard scalars and the heartbeats' step (the status page) count the job's steps from there,
    so a resumed run goes on where the interrupted one stopped instead of counting from 0 again.
    """

    def __init__(self, kv: _Store, every: int, sink: Callable[[dict[str, Any]], None] | None = None,
                 start: int = 0) -> None:
        if every < 1:
            raise ValueError(f"record every >= 1 steps, got {every}")
        if start < 0:
            raise ValueError(f"the start step is >= 0, got {start}")
        self.kv = kv
        self.every = every
        self.sink = sink  # also gets every record (e.g. a TensorBoardSink)
        self.steps = start  # the job's steps done (elapsed_s, step_s and net_wait_s are this run's)
        self.net_wait_s = 0.0
        self.started = time.monotonic()
        self._interval_started = self.started
        self._interval_steps = 0
        self._losses: list[float] = []
        self._meter = WanMeter(kv) if kv.is_master_worker else None

    def waited(self, seconds: float) -> None:
        self.net_wait_s += seconds

    def step(self) -> None:
        self.steps += 1
        self._interval_steps += 1
        elapsed = time.monotonic() - self.started
        # the heartbeats' report (the status page): this worker's step and share of time not waiting on the network
        self.kv.pulse.note(step=self.steps, busy=1.0 - self.net_wait_s / elapsed if elapsed > 0 else 1.0)
        if self.steps % self.every == 0:
            self.write()

    def log(self, **metrics: float) -> None:
        """``loss`` joins the next record's mean; anything else (accuracy ...) is written at once."""
        loss = metrics.pop("loss", None)
        if loss is not None:
            value = float(loss.item() if hasattr(loss, "item") else loss)
            if math.isfinite(value):
                self._losses.append(value)
        if metrics:  # an evaluation: its own record; the training losses keep averaging for the next one
            self.write(interval=False, **{k: float(v.item() if hasattr(v, "item") else v) for k, v in metrics.items()})

    def write(self, interval: bool = True, **extra: float) -> None:
        """One record: the counters, ``extra``, and (``interval``) the mean loss and step time since the last."""
        now = time.monotonic()
        counters = self.kv.counters()
        record: dict[str, Any] = {"step": self.steps, "elapsed_s": now - self.started,
                                  "lan_bytes": _traffic(counters, "lan"), "wan_bytes": _traffic(counters, "wan"),
                                  "net_wait_s": self.net_wait_s}
        if interval and self._interval_steps:
            record["step_s"] = (now - self._interval_started) / self._interval_steps
        if interval and self._losses:
            record["loss"] = sum(self._losses) / len(self._losses)
        if self._meter is not None and self._meter.latest is not None:
            record["wan_bytes_total"] = self._meter.latest
        record.update(extra)
        self.kv.record(**record)
        if self.sink is not None:
            self.sink(record)
        if interval:
            self._losses = []
            self._interval_started, self._interval_steps = now, 0

    def close(self) -> None:
        """A last record (with a final WAN reading on the master), then stop the background meter."""
        if self._meter is not None:
            self._meter.stop()
        if self._interval_steps or self._losses:
            self.write()
        close = getattr(self.sink, "close", None)
        if close is not None:
            close()
