"""The house rules of issue 13, checked on every run: small files, small classes, lines of at most 120 columns,
and a server core that names no algorithm (what `grep -Ei "hfa|esync|..." src/geomx/core src/geomx/server` checks
by hand)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "geomx"
MAX_LINES = 400
MAX_METHODS = 25
MAX_COLUMNS = 120  # pyproject.toml's line-length (ruff), for the package, the tests and the examples
FEATURES = re.compile(r"hfa|esync|dgt|udp|tsengine|relay|fp16|dcasgd", re.IGNORECASE)


def sources() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def test_no_source_file_is_over_400_lines() -> None:
    long = {str(p.relative_to(SRC)): n for p in sources() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_no_python_line_is_over_120_columns() -> None:
    root = SRC.parents[1]
    files = [*sources(), *sorted((root / "tests").rglob("*.py")), *sorted((root / "examples").rglob("*.py"))]
    wide = [f"{path.relative_to(root)}:{number}" for path in files
            for number, line in enumerate(path.read_text().splitlines(), 1) if len(line) > MAX_COLUMNS]
    assert wide == []


def test_no_class_has_over_25_methods() -> None:
    big = {}
    for path in sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                methods = [n for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
                if len(methods) > MAX_METHODS:
                    big[f"{path.relative_to(SRC)}:{node.name}"] = len(methods)
    assert big == {}


# The composition roots are the one place that maps a config to plug-in names: they may name algorithms.
COMPOSITION_ROOTS = {"server/compose.py", "worker/compose.py"}


@pytest.mark.parametrize("package", ["core", "server", "worker"])
def test_the_server_and_worker_cores_name_no_algorithm(package: str) -> None:
    hits = [f"{p.relative_to(SRC)}:{i}: {line.strip()}" for p in sorted((SRC / package).rglob("*.py"))
            if str(p.relative_to(SRC)) not in COMPOSITION_ROOTS
            for i, line in enumerate(p.read_text().splitlines(), 1) if FEATURES.search(line)]
    assert hits == []


def test_the_package_root_keeps_only_its_public_faces() -> None:
    """The kvstore API, the server optimizers, the command line, the launcher, the node entry point and the
    package itself; everything else lives in a folder that names its layer."""
    assert sorted(p.name for p in SRC.glob("*.py")) == [
        "__init__.py", "cli.py", "kv.py", "launch.py", "node.py", "optim.py"]


def test_the_launcher_schedulers_and_servers_do_not_import_torch() -> None:
    """torch costs about 1.6 CPU-s and 190 MB per process: only workers pay it. A global server that built,
    stepped, saved and restored every server optimizer (NumPy arithmetic) needs none either."""
    import subprocess
    import sys

    code = ("import sys, numpy as np, geomx.launch, geomx.node, geomx.cluster.scheduler, geomx.server; "
            "from geomx.server.configure import build_optimizer; from geomx.optim import OPTIMIZERS\n"
            "for name in sorted(OPTIMIZERS):\n"
            "    opt = build_optimizer({'name': name, 'params': {'weight_decay': 0.1}})\n"
            "    opt.received((0, 0), 'dc0', np.ones(4, np.float32))\n"
            "    for _ in range(2): opt.step((0, 0), np.ones(4, np.float32), np.ones(4, np.float32), 'dc0')\n"
            "    build_optimizer(opt.spec()).load_state(*opt.state())\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"


def test_every_folder_face_names_its_modules() -> None:
    """A package's ``__init__.py`` docstring (its folder face) names each of its modules and subpackages, as
    ``name`` (or ``name.py``) in double backquotes, so a reader finds every part from the face."""
    unnamed = {}
    for init in sorted(SRC.rglob("__init__.py")):
        folder = init.parent
        face = ast.get_docstring(ast.parse(init.read_text())) or ""
        parts = sorted([p.stem for p in folder.glob("*.py") if p.stem != "__init__"]
                       + [p.name for p in folder.iterdir() if (p / "__init__.py").is_file()])
        missing = [part for part in parts if f"``{part}``" not in face and f"``{part}.py``" not in face]
        if missing:
            unnamed[str(folder.relative_to(SRC))] = missing
    assert unnamed == {}
