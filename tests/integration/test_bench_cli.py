"""``geomx bench --only emulation --quick`` end to end: the real command, its table, its bench.json.

The emulation section is the cheapest (two vans over real sockets on 127.0.0.1, a few seconds); the point is
the command's wiring (the section table, the runner, the report and the JSON), not the figures, which are
measured, never asserted: the table must have one row per rate and each rate must have been measured.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from geomx.bench.emulation import RATES_BPS


def test_geomx_bench_only_emulation_quick_runs_and_writes_its_table_and_json(tmp_path: Path):
    out = tmp_path / "bench"
    done = subprocess.run([sys.executable, "-m", "geomx.cli", "bench", "--only", "emulation", "--quick",
                           "--out", str(out)], capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((out / "bench.json").read_text())
    assert report["sections"] == ["emulation"] and report["quick"] is True
    rows = report["emulation"]["rows"]
    assert [row["rate_bps"] for row in rows] == list(RATES_BPS)
    assert all(row["achieved_bps"] and row["arrived"] == row["messages"] for row in rows), rows
    assert report["emulation"]["errors"] == []
    table = done.stdout[done.stdout.index("[emulation] 2 vans"):]
    for rate in RATES_BPS:
        assert f"{rate / 1e6:g} Mbit/s" in table
    assert "[training]" not in done.stdout and "[sync]" not in done.stdout  # --only: nothing else ran
