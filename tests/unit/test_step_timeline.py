"""benchmarks/step_timeline.py reads a run folder as ``GEOMX_TRACE=1 geomx launch --run-dir R`` leaves it
(``R/trace/``), as well as a wan bench row's (``R/run-dc0/trace/``, ``R/run-dc1/trace/``).

Seen before: on a ``geomx launch`` folder it said ``no traced PUSHPULL events under R/run-*/trace`` although
R/trace/*.jsonl held them (docs/deployment.md tells readers to run it on a run folder).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

TIMELINE = Path(__file__).resolve().parents[2] / "benchmarks" / "step_timeline.py"
STEPS = 8


def event(node: str, t: float, what: str, peer: str, rnd: int, reply: bool) -> dict[str, object]:
    """One PUSHPULL trace record of key 0, slice 0, as geomx.transport.trace writes it."""
    return {"node": node, "t": t, "event": what, "peer": peer, "kind": "PUSHPULL", "key": 0, "slice": 0,
            "round": rnd, "reply": reply, "nbytes": 4096}


def write_trace(run: Path) -> None:
    """dc1's worker pushing every second; its local server crossing to the global server and back."""
    rows: dict[str, list[dict[str, object]]] = {"dc1_worker0": [], "dc1_server": [], "global_server0": []}
    for rnd in range(STEPS):
        start = 1000.0 + rnd
        rows["dc1_worker0"].append(event("dc1/worker0", start, "queue", "dc1/server", rnd, False))
        rows["dc1_server"] += [event("dc1/server", start + 0.1, "out", "global_server0", rnd, False),
                               event("dc1/server", start + 0.4, "in", "global_server0", rnd, True)]
        rows["global_server0"] += [event("global_server0", start + 0.2, "in", "dc1/server", rnd, False),
                                   event("global_server0", start + 0.3, "out", "dc1/server", rnd, True)]
    (run / "trace").mkdir(parents=True)
    for name, records in rows.items():
        (run / "trace" / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


@pytest.mark.parametrize("layout", ["launch", "wan_row"])
def test_the_timeline_reads_a_launch_run_folder_and_a_wan_rows_folder(tmp_path: Path, layout: str):
    write_trace(tmp_path if layout == "launch" else tmp_path / "run-dc1")
    done = subprocess.run([sys.executable, str(TIMELINE), str(tmp_path), "--skip", "2"], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "first WAN push leaves" in done.stdout
    assert "0.200" in done.stdout  # the push at the global server, 0.2 s into each step


def test_an_untraced_folder_names_both_places_looked(tmp_path: Path):
    done = subprocess.run([sys.executable, str(TIMELINE), str(tmp_path)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 1
    assert f"no traced PUSHPULL events under {tmp_path}/trace or {tmp_path}/run-*/trace" in done.stderr
