"""Where the test suite's CPU goes: a pytest plugin that writes each test's wall time and CPU seconds (the xdist
worker's own, and its reaped children's: every job's processes, torchrun's ranks included), and a summary by module.

CI's budget is in wall minutes on 2 cores, and a job's wall time depends on the machine's load; its CPU seconds much
less (though polling loops and heartbeats do cost more under load, when jobs run longer). Usage::

    PYTHONPATH=scripts .venv/bin/python -m pytest -n 2 --dist loadscope -p suite_cpu tests   # writes runs/suite-cpu/
    .venv/bin/python scripts/suite_cpu.py runs/suite-cpu 30                                   # the 30 costliest modules
"""

from __future__ import annotations

import collections
import json
import os
import resource
import sys
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

# not GEOMX_*: every GEOMX_<NAME> variable is a job setting, and a job refuses one that no plug-in takes
OUT_DIR = Path(os.environ.get("SUITE_CPU_DIR", "runs/suite-cpu"))


def _cpu() -> tuple[float, float]:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, Any, None]:
    started, (own, children) = time.time(), _cpu()
    yield
    own_after, children_after = _cpu()
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(OUT_DIR / f"{worker}.jsonl", "a") as out:
        out.write(json.dumps({"id": item.nodeid, "start": started, "stop": time.time(), "self": own_after - own,
                              "children": children_after - children}) + "\n")


def summary(folder: Path, top: int) -> list[str]:
    """Each xdist worker's span, then the ``top`` modules by CPU seconds."""
    lines, modules = [], collections.defaultdict(lambda: [0.0, 0.0, 0])
    for path in sorted(folder.glob("*.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        span = max(r["stop"] for r in rows) - min(r["start"] for r in rows)
        lines.append(f"{path.stem}: {len(rows)} tests in {span:.0f} s")
        for r in rows:
            entry = modules[r["id"].split("::")[0]]
            entry[0] += r["stop"] - r["start"]
            entry[1] += r["self"] + r["children"]
            entry[2] += 1
    lines.append(f"CPU in all: {sum(e[1] for e in modules.values()):.0f} s")
    for module, (wall, cpu, count) in sorted(modules.items(), key=lambda kv: -kv[1][1])[:top]:
        lines.append(f"{cpu:7.1f} CPU-s {wall:7.1f} s  {count:4d} tests  {module}")
    return lines


if __name__ == "__main__":
    print("\n".join(summary(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT_DIR,
                            int(sys.argv[2]) if len(sys.argv) > 2 else 30)))
