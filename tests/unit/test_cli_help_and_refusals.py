"""What ``geomx --help`` says is what the commands do, and flags that would do nothing are refused in one line.

Seen before: ``geomx bench --help`` said ``--only`` defaulted to "all but wan" while six sections ran only on
request; ``geomx bench --quick --only sync --scenario wide`` ran nothing and exited 0 with an empty table;
``geomx launch T --global-only -- python x.py`` ignored the worker command without a word; ``--resume`` said only
the global servers resume; the run folder's default name lacked its ``-<pid>``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from geomx import cli, launch
from geomx.bench import sections, sync


def help_of(capsys: pytest.CaptureFixture[str], *command: str) -> str:
    """``geomx COMMAND --help``, its lines joined (argparse wraps them where it likes)."""
    with pytest.raises(SystemExit) as done:
        cli.main([*command, "--help"])
    assert done.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def test_bench_help_names_the_default_sections_from_the_table(capsys):
    text = help_of(capsys, "bench")
    listed = re.search(r"default: ([a-z, ]+); on request only: ([a-z, ]+)\)", text)
    assert listed, text
    assert listed.group(1).split(", ") == [row.name for row in sections.SECTIONS if row.default]
    assert listed.group(2).split(", ") == [row.name for row in sections.SECTIONS if not row.default]
    assert "all but wan" not in text and "every section but wan" not in text
    assert "(default: bench-results)" in text


def test_the_scenarios_offered_are_the_sync_sections():
    assert list(cli.SYNC_SCENARIOS) == list(sync.SCENARIOS)


@pytest.mark.parametrize(("flags", "said"), [
    (["--quick", "--only", "sync", "--scenario", "wide"], "--scenario wide (the bandwidth-bound CNN's sync rows) is "
                                                          "in the full run only: drop --quick"),
    (["--quick", "--scenario", "same", "--scenario", "wide"], "in the full run only: drop --quick"),
    (["--only", "transport", "--scenario", "same"], "--scenario picks rows of the sync section, which --only leaves "
                                                     "out: add --only sync"),
])
def test_bench_flags_that_would_measure_nothing_are_refused_before_anything_runs(capsys, tmp_path: Path,
                                                                                 flags: list[str], said: str):
    out = tmp_path / "bench"
    assert cli.main(["bench", *flags, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("geomx bench: ") and said in err and len(err.splitlines()) == 1, err
    assert not out.exists()  # no bench.json, no run folder


def test_launch_global_only_with_a_worker_command_is_refused_before_anything_starts(capsys, tmp_path: Path,
                                                                                   monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    topology = Path(__file__).resolve().parents[2] / "topologies" / "demo.yaml"
    assert cli.main(["launch", str(topology), "--global-only", "--", "python", "x.py"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("geomx launch: --global-only starts the global tier alone, no worker: drop the worker "
                          "command (python x.py)") and len(err.splitlines()) == 1, err
    assert list(tmp_path.iterdir()) == []  # no run folder: nothing started


@pytest.mark.parametrize("form", [["--global-only"], ["--party", "dc1"]])
def test_launch_refuses_port_0_for_the_global_scheduler_before_anything_starts(capsys, tmp_path: Path, form,
                                                                               monkeypatch: pytest.MonkeyPatch):
    """Before, ``--global-only --global-scheduler 127.0.0.1:0`` started a scheduler at a random port and told its
    global server port 0: the server waited out the registration timeout against "connection refused"."""
    monkeypatch.chdir(tmp_path)
    topology = Path(__file__).resolve().parents[2] / "topologies" / "demo.yaml"
    command = ["--", "python", "x.py"] if "--party" in form else []
    assert cli.main(["launch", str(topology), *form, "--global-scheduler", "127.0.0.1:0", *command]) == 2
    err = capsys.readouterr().err
    assert err == "geomx launch: --global-scheduler '127.0.0.1:0': port 0 picks a port at random, which the other " \
                  "processes cannot be told: give a free port, or leave the option out on one host\n", err
    assert list(tmp_path.iterdir()) == []


def test_launch_help_says_who_resumes_and_the_defaults(capsys):
    text = help_of(capsys, "launch")
    assert "the global servers and the workers start from their newest valid checkpoints" in text
    assert "GEOMX_RESUME=1" in text
    assert "--global-only (or the central party's launch) starts it" in text
    assert "(default: 127.0.0.1)" in text
    shown = re.search(r"default: (runs/<time>-<topology>-<pid>)\)", text)
    assert shown, text
    name = launch.default_run_dir(Path("job.yaml")).name  # <time>-<topology>-<pid>: the same three parts
    assert re.fullmatch(r"\d{8}-\d{6}-job-\d+", name), name


def test_report_help_shows_its_out_default(capsys):
    assert "report.md and report.json (default: report)" in help_of(capsys, "report")
