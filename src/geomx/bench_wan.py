"""Old path of ``geomx.bench.wan``: ``python -m geomx.bench_wan ...``, as the READMEs cite it, still runs."""

from __future__ import annotations

import runpy

if __name__ == "__main__":
    runpy.run_module("geomx.bench.wan", run_name="__main__", alter_sys=True)
