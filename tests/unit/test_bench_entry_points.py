"""Every ``python -m geomx.bench.*`` entry point parses its flags before anything runs, and a stop ends it as
``geomx bench`` ends (``geomx.bench.alone``).

Seen before: ``python -m geomx.bench.chaos --help`` (and a misspelt ``--quik``) started the full chaos run into
./bench-results, as did ``python -m geomx.bench.recovery --help``; ``python -m geomx.bench.quality --help`` was
``ValueError: unknown quality rows ['--help']``; SIGTERM then printed a traceback ending in ``Interrupted`` and
saved nothing. The section runners themselves are measured, never tested: nothing here starts a job.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import geomx.bench
from geomx.bench import alone, sched, security
from geomx.bench.sections import Interrupted

BENCH = Path(geomx.bench.__file__).parent


def entry_points() -> list[str]:
    """Every module of geomx.bench that runs as ``python -m`` (its workers, started by the sections, aside)."""
    found = []
    for path in sorted(BENCH.rglob("*.py")):
        relative = path.relative_to(BENCH)
        if relative.parts[0] == "workers":
            continue
        if path.name == "__main__.py":
            found.append(".".join(("geomx.bench", *relative.parts[:-1])))
        elif 'if __name__ == "__main__"' in path.read_text():
            found.append(".".join(("geomx.bench", *relative.with_suffix("").parts)))
    return found


ENTRY_POINTS = entry_points()


def run_module(module: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python -m module args`` in ``cwd`` (where a bench would write ./bench-results)."""
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, check=False)


def test_the_scan_finds_the_known_entry_points():
    assert {"geomx.bench.chaos", "geomx.bench.recovery", "geomx.bench.quality", "geomx.bench.sched",
            "geomx.bench.lan", "geomx.bench.scale", "geomx.bench.frontend", "geomx.bench.security",
            "geomx.bench.wan", "geomx.bench.wan.netns"} <= set(ENTRY_POINTS)


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_help_prints_usage_and_starts_nothing(module: str, tmp_path: Path):
    done = run_module(module, "--help", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith(f"usage: python -m {module.removesuffix('.section')} ")
    assert list(tmp_path.iterdir()) == []  # no bench-results: nothing ran


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_a_misspelt_flag_is_refused_in_one_line_and_starts_nothing(module: str, tmp_path: Path):
    extra = ["--only", "dgt"] if module == "geomx.bench.sched" else ["cleanup"] if module.endswith("netns") else []
    done = run_module(module, *extra, "--quik", cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.splitlines()[-1].endswith("error: unrecognized arguments: --quik"), done.stderr
    assert "Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("module", "what"), [("geomx.bench.chaos", "scenario"), ("geomx.bench.quality", "row")])
def test_an_unknown_positional_name_is_refused_with_the_valid_ones(module: str, what: str, tmp_path: Path):
    done = run_module(module, "nope", cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"error: unknown {what} nope; valid: " in done.stderr.splitlines()[-1]
    assert list(tmp_path.iterdir()) == []


STOPPED = """
import os, signal, sys, threading
from pathlib import Path
from geomx.bench.alone import run_alone
from geomx.bench.sections import Interrupted

def measure():
    section = {"rows": ["first"], "errors": []}
    try:
        os.kill(os.getpid(), signal.SIGTERM)  # as `kill` from outside, while a section runs
        threading.Event().wait(30)  # the handler raises here at once; the bound is a safety net only
        return {"rows": [], "errors": ["the signal never came"]}
    except KeyboardInterrupt:
        if sys.argv[2] == "partial":
            raise Interrupted(section) from None
        raise

sys.exit(run_alone("demo", measure, Path(sys.argv[1]), lambda s: [f"[demo] rows {s['rows']}"]))
"""


def test_sigterm_writes_the_rows_finished_and_exits_130_without_a_traceback(tmp_path: Path):
    done = subprocess.run([sys.executable, "-c", STOPPED, str(tmp_path), "partial"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 130, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert json.loads((tmp_path / "demo.json").read_text()) == {"rows": ["first"], "errors": [],
                                                                "interrupted": True}
    assert "[demo] rows ['first']" in done.stdout
    assert "[demo] interrupted by SIGTERM: the rows above are those finished before the stop" in done.stdout


def test_a_section_without_partial_rows_says_nothing_was_written(tmp_path: Path):
    done = subprocess.run([sys.executable, "-c", STOPPED, str(tmp_path), "none"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 130, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[demo] interrupted by SIGTERM: nothing was written"
    assert list(tmp_path.iterdir()) == []


class NoSignals:
    """In place of StopOnSignals in this process (the pytest worker): no handlers, no subreaper, nothing ended."""

    signum = None

    def __enter__(self) -> NoSignals:
        return self

    def __exit__(self, *_exc: object) -> None:
        pass

    def ignore(self) -> None:
        pass


def test_a_finished_run_writes_its_json_and_exits_1_on_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(alone, "StopOnSignals", NoSignals)

    def lines(section: dict[str, object]) -> list[str]:
        return ["[demo] table"]

    assert alone.run_alone("demo", lambda: {"rows": [1], "errors": []}, tmp_path, lines) == 0
    assert json.loads((tmp_path / "demo.json").read_text()) == {"rows": [1], "errors": []}
    assert alone.run_alone("demo", lambda: {"errors": ["x"]}, tmp_path, lines, json_name="other") == 1
    assert json.loads((tmp_path / "other.json").read_text()) == {"errors": ["x"]}
    assert isinstance(Interrupted({}), KeyboardInterrupt)  # what run_alone catches


def test_sched_prints_only_the_parts_it_ran():
    multigps = {"1": {"global_servers": 1, "step_ms": 68.0, "per_server": {"g0": {"recv_mb": 208.0, "cpu_s": 0.6}}}}
    text = "\n".join(sched.lines({"multigps": multigps, "errors": []}))
    assert "[sched] MultiGPS" in text and "68" in text
    assert "DGT" not in text and "TSEngine" not in text and "UDP MB" not in text
    whole = "\n".join(sched.lines({"multigps": multigps, "dgt": {}, "tsengine": {}, "tsengine_intra": {},
                                   "errors": []}))
    assert "[sched] DGT" in whole and whole.count("[sched] TSEngine") == 2  # geomx bench --only sched: every part


def test_security_leaves_an_unmeasured_ratio_as_a_dash_in_its_column():
    section = {"setup": {"reps": 5}, "errors": [],
               "rows": [{"size_mb": 4.0, "none_gbps": 0.8},
                        {"size_mb": 32.0, "none_gbps": 0.7, "secret_gbps": 0.77, "secret_over_none": 1.1,
                         "curve_gbps": 0.41, "curve_over_none": 0.59}]}
    header, partial, whole = security.lines(section)[1:4]
    assert "-x" not in partial
    assert [cell.strip() for cell in partial.split("|")] == ["4MB", "0.800", "-", "-", "-", "-"]
    assert [len(cell) for cell in partial.split("|")] == [len(cell) for cell in header.split("|")] \
        == [len(cell) for cell in whole.split("|")]  # the columns line up
