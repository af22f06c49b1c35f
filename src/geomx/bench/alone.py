"""A section run on its own (``python -m geomx.bench.NAME``), stopped the way ``geomx bench`` stops.

Each module's entry point parses its flags with argparse (``--help``, an unknown flag refused in one line, exit 2)
before anything runs, then hands its measurement here: SIGINT or SIGTERM stop the job in flight and every process
the section started (``StopOnSignals``), the rows it finished are written when the section hands them over
(``sections.Interrupted``), marked ``interrupted``, and the command exits 130 without a traceback; a finished run
writes ``OUT/NAME.json``, prints the table and exits 1 when something could not be measured.

Usage::

    sys.exit(run_alone("lan", lambda: measure_rows(...), Path(args.out), lines))
"""

from __future__ import annotations

import argparse
import signal
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any

from ..cluster.processes import StopOnSignals
from .sections import Interrupted
from .tables import say, write_and_print

INTERRUPTED = 130  # as a shell reports a command ended by SIGINT; geomx bench's code too


def add_out(parser: argparse.ArgumentParser, name: str) -> None:
    """The ``--out`` folder every entry point takes. Usage: ``add_out(parser, "chaos")``"""
    parser.add_argument("--out", default="bench-results", help=f"folder for {name}.json (default: bench-results)")


def chosen(parser: argparse.ArgumentParser, given: Sequence[str], valid: Collection[str], what: str,
           default: Sequence[str]) -> tuple[str, ...]:
    """The ``what`` (rows, scenarios) named on the command line, ``default`` where none is; an unknown one is
    argparse's one-line error (exit 2) naming the valid ones. Usage: ``chosen(parser, args.rows, ROWS, "row", ROWS)``"""
    unknown = [name for name in given if name not in valid]
    if unknown:
        parser.error(f"unknown {what} {', '.join(unknown)}; valid: {', '.join(valid)}")
    return tuple(given) or tuple(default)


def run_alone(name: str, measure: Callable[[], dict[str, Any]], out_dir: Path | None,
              lines: Callable[[dict[str, Any]], list[str]], json_name: str | None = None) -> int:
    """Run ``measure`` under ``StopOnSignals``; write ``OUT/<json_name or name>.json`` and print the table.

    ``out_dir`` None: ``measure`` writes and prints its own results (the wan section), only the stop is handled
    here. Returns 0, 1 (a row could not be measured) or 130 (stopped by a signal)."""
    with StopOnSignals() as stop:
        try:
            section = measure()
        except KeyboardInterrupt as exc:
            stop.ignore()  # the partial results are written whatever comes next
            signame = signal.Signals(stop.signum).name if stop.signum else "SIGINT"
            if isinstance(exc, Interrupted) and out_dir is not None:
                exc.partial["interrupted"] = True
                write_and_print(json_name or name, exc.partial, out_dir, lines)
                say(f"[{name}] interrupted by {signame}: the rows above are those finished before the stop "
                    f"({out_dir / (json_name or name)}.json)")
            else:
                say(f"[{name}] interrupted by {signame}: nothing was written")
            return INTERRUPTED
        stop.ignore()
        if out_dir is not None:
            write_and_print(json_name or name, section, out_dir, lines)
    return 1 if section.get("errors") else 0
