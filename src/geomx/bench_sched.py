"""Old path of ``geomx.bench.sched``: ``python -m geomx.bench_sched ...``, as the READMEs cite it, still runs."""

from __future__ import annotations

import runpy

if __name__ == "__main__":
    runpy.run_module("geomx.bench.sched", run_name="__main__", alter_sys=True)
