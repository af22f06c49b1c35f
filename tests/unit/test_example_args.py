"""The examples refuse a bad argument in one line before joining a job.

Why: ``examples/cnn_bsc.py --threshold 2`` passed argparse and every worker died in
``kv.set_gradient_compression`` with a traceback; ``cnn.py --slowdown 0.5`` (and ``cnn_esync.py``'s) died in
``time.sleep`` with one; ``cnn.py --ssp --mixed-sync`` silently ran MixedSync, ``--dcasgd --dcadam`` DCASGD, and
``--dcasgd`` without either FSA with a compensation that is zero there; ``cnn_hfa.py --global-rounds 0`` trained
``--epochs`` instead, and ``-1`` nothing.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize(("script", "args", "says"), [
    ("cnn_bsc.py", ["--threshold", "2"], "threshold=2.0 is the fraction of elements kept"),
    ("cnn_bsc.py", ["--type", "mpq", "--momentum", "1.5"], "momentum=1.5 must be in [0, 1)"),
    ("cnn_mpq.py", ["--threshold", "0"], "threshold=0.0 is the fraction of elements kept"),
    ("cnn_mpq.py", ["--size-lower-bound", "-3"], "size_lower_bound=-3 must be >= 0"),
    ("cnn.py", ["--dcasgd"], "--dcasgd needs --mixed-sync or --ssp"),
    ("cnn.py", ["--mixed-sync", "--slowdown", "0.5"], "--slowdown is how many times slower"),
    ("cnn_esync.py", ["--slowdown", "0"], "--slowdown is how many times slower"),
    ("cnn_hfa.py", ["--global-rounds", "0"], "--global-rounds must be at least 1, got 0"),
])
def test_a_bad_codec_argument_is_one_line(script: str, args: list[str], says: str) -> None:
    # outside `geomx launch`: the refusal comes before the script looks for its job
    done = subprocess.run([sys.executable, str(EXAMPLES / script), *args], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and lines[0].startswith(f"{script}: error:"), done.stderr


@pytest.mark.parametrize("args", [["--ssp", "--mixed-sync"], ["--mixed-sync", "--dcasgd", "--dcadam"]])
def test_flags_that_exclude_each_other_are_refused(args: list[str]) -> None:
    done = subprocess.run([sys.executable, str(EXAMPLES / "cnn.py"), *args], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and "not allowed with argument" in done.stderr, done.stderr
