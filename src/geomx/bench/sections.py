"""The bench's sections: one table row per section, naming the module that measures it.

A section is a module with two public functions: ``run(plan: BenchPlan, out_dir: Path) -> dict`` (measure; the
dict goes to bench.json under the section's name, with ``errors``: a list of what could not be measured)
and ``lines(section: dict) -> list[str]`` (its table for the report). A section stopped by a signal may raise
``Interrupted`` with the rows it finished; they are written, marked interrupted. Adding a section is one such module
and one row here; ``geomx bench --only NAME`` takes its choices from this table. The modules are named, not
imported, so that ``geomx --help`` does not import torch.

Usage::

    module = module_of(section("sync"))
    print("\\n".join(module.lines(module.run(BenchPlan(quick=True), Path("bench-results")))))
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any


@dataclass(frozen=True)
class BenchPlan:
    """How much to run: ``quick`` (fewer steps and repetitions) or the full bench; each section sizes itself
    from it. ``sync_scenarios``: run only these scenarios' rows of the sync section (empty: all); ``wan_job``:
    the wan section's job; ``wan_congestion``: its link's TCP congestion control (None: the host's);
    ``scale_path``: the scale section's path for HFA's rounds (``cpu``, or ``staged``: the GPU's shape)."""

    quick: bool
    sync_scenarios: tuple[str, ...] = ()
    wan_job: str | None = None  # the wan section's job: mlp, lm or all (None: mlp with quick, all otherwise)
    wan_congestion: str | None = None  # e.g. "cubic" (geomx.bench.wan.netns)
    scale_path: str = "cpu"  # geomx.bench.scale.PATHS


class Interrupted(KeyboardInterrupt):
    """A section stopped by SIGINT or SIGTERM (``launch.StopOnSignals``), carrying what it measured so far (its
    dict as ``run`` would return it, with ``interrupted: True``): ``geomx bench`` writes it and stops.

    Usage: ``except KeyboardInterrupt: section["interrupted"] = True; raise Interrupted(section) from None``
    """

    def __init__(self, partial: dict[str, Any]) -> None:
        super().__init__("interrupted")
        self.partial = partial


@dataclass(frozen=True)
class Section:
    """One row of the table: ``geomx bench --only NAME`` runs ``MODULE.run``; ``default``: in a plain run."""

    name: str
    module: str
    default: bool
    summary: str


SECTIONS: tuple[Section, ...] = (
    Section("training", "geomx.bench.training", True, "HiPS against a flat PS on the emulated WAN"),
    Section("transport", "geomx.bench.transport", True, "kv.pushpull against gloo all_reduce on loopback"),
    Section("emulation", "geomx.bench.emulation", True, "the WAN emulator's achieved rate against its setting"),
    Section("sync", "geomx.bench.sync", True, "every synchronization algorithm: time to a target accuracy"),
    Section("codecs", "geomx.bench.codecs", True, "every WAN codec: bytes per step, speed, accuracy"),
    Section("frontend", "geomx.bench.frontend", True, "the PyTorch wrapper's overlap, P3's priority and slicing"),
    Section("sched", "geomx.bench.sched", True, "MultiGPS, DGT, TSEngine"),
    Section("security", "geomx.bench.security", True, "what a shared secret and CURVE cost in throughput"),
    Section("lan", "geomx.bench.lan", False, "one party's step: DDP against the collective and server LAN tiers"),
    Section("wan", "geomx.bench.wan", False, "against DDP, local SGD, DiLoCo on a kernel-shaped link (root)"),
    Section("quality", "geomx.bench.quality", False, "every algorithm and codec: validation loss at one token budget"),
    Section("chaos", "geomx.bench.chaos", False, "a slow or lost data center, rank or global tier: stalls, resume"),
    Section("recovery", "geomx.bench.recovery", False, "a lost data center's restart, in parts, at 85M (stand-in GPU)"),
    Section("scale", "geomx.bench.scale", False, "the 85M job's utilization against WAN bandwidth (stand-in GPU)"),
)
SECTION_NAMES: tuple[str, ...] = tuple(s.name for s in SECTIONS)


def section(name: str) -> Section:
    """The table's row for ``name``; a ValueError lists the valid names."""
    for row in SECTIONS:
        if row.name == name:
            return row
    raise ValueError(f"unknown bench section {name!r}; valid: {', '.join(SECTION_NAMES)}")


def chosen(names: list[str] | None) -> list[Section]:
    """The rows to run, in table order: ``names`` (any order, repeats ignored) or every ``default`` row."""
    wanted = {section(name).name for name in names} if names else None
    return [row for row in SECTIONS if (row.name in wanted if wanted is not None else row.default)]


def module_of(row: Section) -> ModuleType:
    """Import the row's module (its ``run`` and ``lines``)."""
    return importlib.import_module(row.module)
