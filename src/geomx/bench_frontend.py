"""Old path of ``geomx.bench.frontend``: ``python -m geomx.bench_frontend ...``, as the READMEs cite it, still runs."""

from __future__ import annotations

import runpy

if __name__ == "__main__":
    runpy.run_module("geomx.bench.frontend", run_name="__main__", alter_sys=True)
