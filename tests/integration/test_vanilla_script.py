"""The by-hand launch of docs/deployment.md: ``scripts/run_vanilla_hips.sh`` starts every process with GeoMX's
DMLC_* variables alone (no topology file, so the global server does not know the other party's size)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from harness import REPO_ROOT

pytestmark = pytest.mark.slow


def test_the_by_hand_script_trains(tmp_path):
    done = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "run_vanilla_hips.sh"), sys.executable, "2"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=180)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "ConfigError" not in output and "Traceback" not in output, output[-4000:]
    # the master worker's progress: both epochs ran and the model learned (chance is 0.1)
    final = re.search(r"final test accuracy (\d\.\d+) after (\d+) steps", output)
    assert final is not None, output[-4000:]
    assert int(final.group(2)) == 2 * 11 and float(final.group(1)) > 0.5, final.group(0)
