"""Debug-only message timeline: when each message was queued, handed to its socket, received and handled.

Off unless ``GEOMX_TRACE=1`` (read by ``geomx.config``, nowhere else): then every node keeps one tuple per
message event in memory and writes them as JSON lines to ``RUN/trace/<node>.jsonl`` when its van stops. The
clock is ``time.time()``, shared by every process of one machine (network namespaces included), so the files
of all nodes merge into one timeline (``benchmarks/step_timeline.py`` does, per slice and step). The cost
when on is a tuple append per event; when off, one ``is None`` test per event.

Usage::

    tracer = Tracer.for_node(config, "dc1/server/0")   # None unless config.trace
    tracer.event("in", peer, message.kind.name, message.key, message.slice, message.round, reply, nbytes)
    tracer.close()                                      # writes the file
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..protocol.wire import Message

FIELDS = ("t", "event", "peer", "kind", "key", "slice", "round", "reply", "nbytes")


class Tracer:
    """Events of one node, kept in memory and written once (see the module docstring)."""

    def __init__(self, path: Path, node: str) -> None:
        self.path = path
        self.node = node
        self._events: list[tuple[Any, ...]] = []
        self._lock = threading.Lock()
        self._closed = False

    @classmethod
    def for_node(cls, trace: bool, run_dir: Path | None, node: str) -> Tracer | None:
        """A tracer writing to ``run_dir/trace/`` when ``trace`` is on and there is a run folder, else None."""
        if not trace or run_dir is None:
            return None
        return cls(Path(run_dir) / "trace" / f"{node.replace('/', '_')}.jsonl", node)

    def event(self, event: str, peer: str, kind: str, key: int, index: int, rnd: int, reply: bool,
              nbytes: int, at: float | None = None) -> None:
        """One event (any thread), at ``at`` (``time.time()``'s clock; default: now)."""
        self._events.append((time.time() if at is None else at, event, peer, kind, key, index, rnd, reply, nbytes))

    def message(self, event: str, peer: str, message: Message, nbytes: int) -> None:
        """Record ``event`` for ``message`` (its kind, key, slice, round and whether it is an answer)."""
        self.event(event, peer, message.kind.name, message.key, message.slice, message.round, message.is_reply,
                   nbytes)

    def handled(self, handler: Callable[[Message], None]) -> Callable[[Message], None]:
        """``handler``, recording a ``handled`` event after each message it handled without raising."""
        def traced(message: Message) -> None:
            handler(message)
            self.message("handled", message.sender.decode(), message, 0)
        return traced

    def close(self) -> None:
        """Write the events (once; later calls do nothing)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("w") as out:
                for row in self._events:
                    out.write(json.dumps({"node": self.node, **dict(zip(FIELDS, row, strict=True))}) + "\n")


def read_trace(run_dirs: list[Path]) -> list[dict[str, Any]]:
    """Every event of every node under ``run_dirs`` (``*/trace/*.jsonl``), in time order."""
    events = []
    for run_dir in run_dirs:
        for path in sorted(Path(run_dir).glob("trace/*.jsonl")):
            events += [_event(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]
    return sorted(events, key=lambda e: e["t"])


def _event(row: dict[str, Any]) -> dict[str, Any]:
    """One event as this version writes it (an older geomx's traces name the slice "part")."""
    if "part" in row and "slice" not in row:
        row["slice"] = row.pop("part")
    return row
