"""Plain-text tables and progress lines for ``geomx bench``: every section prints through these.

Usage::

    say("[sync] starting ...")
    print("\\n".join(table(["codec", "ratio"], [["fp16", fmt(0.5, ".2f", "x")]])))
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def say(text: str) -> None:
    """Print one progress or table line at once (the bench runs for minutes: the reader follows along)."""
    print(text, flush=True)


def fmt(value: Any, spec: str, suffix: str = "") -> str:
    """``value`` formatted with ``spec`` and ``suffix``, or "-" when it was not measured (None).

    Usage: ``fmt(1.234, ".2f", "x") == "1.23x"``; ``fmt(None, ".2f") == "-"``.
    """
    if value is None:
        return "-"
    return f"{value:{spec}}{suffix}"


def table(headers: list[str], rows: list[list[str]], left: int = 1) -> list[str]:
    """Plain-text columns: the first ``left`` left-aligned, the others right-aligned; a dashed rule under the header.

    Usage: ``table(["a", "b"], [["x", "1"]])`` -> ``["a  b", "-  -", "x  1"]``.
    """
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i < left else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True)))

    return [line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)]


def write_and_print(name: str, section: dict[str, Any], out_dir: Path,
                    lines: Callable[[dict[str, Any]], list[str]]) -> None:
    """A section run on its own (``python -m geomx.bench.NAME``): ``OUT/NAME.json``, its table, then each error.

    Usage: ``write_and_print("lan", section, Path("bench-results"), lines)``
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.json").write_text(json.dumps(section, indent=2, default=str))
    print("\n".join(lines(section)))
    for error in section.get("errors", []):
        print(f"[{name}] failed: {error}")
