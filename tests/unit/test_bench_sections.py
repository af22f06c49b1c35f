"""The bench's section table: ``--only`` offers exactly its rows, every row's module has ``run`` and ``lines``,
the report prints each measured section through them, and a killed process is never waited for without end.
No job runs here (the benches are measured, never tested)."""

from __future__ import annotations

import ast
import inspect
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from geomx.bench import jobs, runner, sections
from geomx.cli import build_parser
from geomx.launch import KILL_WAIT_S


def only_choices(capsys: pytest.CaptureFixture[str]) -> list[str]:
    """The choices ``geomx bench --only`` offers, as its error message lists them."""
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "--only", "nope"])
    listed = re.search(r"invalid choice: 'nope' \(choose from (.*)\)", capsys.readouterr().err)
    assert listed, "argparse's message changed"
    return [name.strip(" '") for name in listed.group(1).split(",")]


def test_only_offers_exactly_the_table_rows_in_table_order(capsys):
    assert only_choices(capsys) == [row.name for row in sections.SECTIONS]
    assert len(set(sections.SECTION_NAMES)) == len(sections.SECTIONS)
    args = build_parser().parse_args(["bench", "--only", "sync", "--only", "transport"])
    assert [row.name for row in sections.chosen(args.only)] == ["transport", "sync"]  # table order, not argv's


@pytest.mark.parametrize("row", sections.SECTIONS, ids=lambda row: row.name)
def test_every_section_module_exposes_run_and_lines(row: sections.Section):
    module = sections.module_of(row)
    assert module.__name__ == row.module == f"geomx.bench.{row.name}"
    assert list(inspect.signature(module.run).parameters) == ["plan", "out_dir"]
    assert len(inspect.signature(module.lines).parameters) == 1  # the section's dict from bench.json
    assert module.__doc__ and f"--only {row.name}" in module.__doc__  # says how to run it


def test_a_plain_run_takes_every_default_row_and_wan_only_on_request():
    assert [row.name for row in sections.chosen(None)] == [r.name for r in sections.SECTIONS if r.default]
    assert "wan" not in [row.name for row in sections.chosen(None)]
    assert [row.name for row in sections.chosen(["wan"])] == ["wan"]
    with pytest.raises(ValueError, match="unknown bench section 'nope'; valid: training, "):
        sections.chosen(["nope"])


def test_the_report_prints_each_section_through_its_module_and_names_what_was_not_measured(monkeypatch):
    printed: dict[str, Any] = {}

    def fake_lines(name: str):
        def lines(section: dict[str, Any]) -> list[str]:
            printed[name] = section
            return [f"[{name}] table"]
        return lines

    modules = {row.module: type("M", (), {"lines": staticmethod(fake_lines(row.name))}) for row in sections.SECTIONS}
    monkeypatch.setattr(runner, "module_of", lambda row: modules[row.module])
    report = {"quick": True, "machine": {"cores": 2}, "load_avg_start": [0.1, 0.1, 0.1], "json_path": "x.json",
              "sync": {"rows": 1}, "transport": {"rows": 2}, "wan_error": "RuntimeError: needs root"}
    text = runner.format_report(report)
    assert printed == {"transport": {"rows": 2}, "sync": {"rows": 1}}
    assert text.index("[transport] table") < text.index("[sync] table")  # table order
    assert "[wan] not measured: RuntimeError: needs root" in text
    assert "[codecs]" not in text


class StuckProcess:
    """A process that SIGKILL does not reap in time (stuck in the kernel): wait must be bounded."""

    pid = 4242
    returncode = None

    def __init__(self) -> None:
        self.killed = False
        self.waits: list[float | None] = []

    def poll(self) -> int | None:
        return None

    def kill(self) -> None:
        self.killed = True

    def wait(self, timeout: float | None = None) -> int:
        self.waits.append(timeout)
        if timeout is None:
            raise AssertionError("an unbounded wait after kill() would hang here for ever")
        raise subprocess.TimeoutExpired("stuck", timeout)


def test_kill_all_reaps_what_it_can_and_reports_a_process_that_does_not_exit(tmp_path: Path):
    real = subprocess.Popen(["sleep", "60"], stdout=subprocess.DEVNULL)
    stuck = StuckProcess()
    assert jobs.kill_all([real, stuck]) == [stuck.pid]  # type: ignore[list-item]
    assert real.returncode is not None  # killed and reaped
    assert stuck.killed and stuck.waits == [KILL_WAIT_S]


def bench_imports() -> dict[str, list[tuple[str, str | None]]]:
    """Every geomx.bench module's imports of geomx.bench modules (function-level and TYPE_CHECKING ones too):
    module -> [(imported module, imported name or None)]."""
    package = Path(sections.__file__).parent
    found: dict[str, list[tuple[str, str | None]]] = {}
    for path in sorted(package.glob("*.py")):
        name = "geomx.bench" if path.stem == "__init__" else f"geomx.bench.{path.stem}"
        found[name] = []
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                target = f"geomx.bench.{node.module}" if node.module else "geomx.bench"
                found[name] += [(target, a.name) if node.module else (f"geomx.bench.{a.name}", None)
                                for a in node.names]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("geomx.bench"):
                found[name] += [(node.module or "", a.name) for a in node.names]
    return found


def test_the_bench_modules_import_no_private_name_and_form_no_circle():
    imports = bench_imports()
    private = [f"{m} imports {t}.{n}" for m, edges in imports.items() for t, n in edges
               if n and n.startswith("_") and not n.startswith("__")]
    assert private == []
    graph = {m: {t for t, _ in edges if t in imports and t != m} for m, edges in imports.items()}
    assert graph["geomx.bench.runner"] and graph["geomx.bench.sync"]  # the scan sees imports at all
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, f"import circle: {' -> '.join((*path, module))}"
        if module in done:
            return
        for target in graph[module]:
            visit(target, (*path, module))
        done.add(module)

    for module in graph:
        visit(module, ())
