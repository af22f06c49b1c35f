"""benchmarks/soak.py refuses an --out that holds an earlier soak: its run folders would be launched into again and
their metrics read as this run's steps (a second soak in one folder once printed -354 steps per second)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SOAK = Path(__file__).resolve().parents[2] / "benchmarks" / "soak.py"


def test_a_soak_into_a_folder_that_is_not_empty_is_refused_before_anything_starts(tmp_path):
    (tmp_path / "dc0-0").mkdir()  # an earlier soak's run folder
    done = subprocess.run([sys.executable, str(SOAK), "--out", str(tmp_path), "--minutes", "0.1"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"--out {tmp_path} is not empty" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dc0-0"]  # nothing written, nothing launched
