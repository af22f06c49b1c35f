"""``python -m geomx.bench.chaos [SCENARIO ...] [--quick] [--out OUT]``: the chosen scenarios (default: every one)
at ``FULL`` (``--quick``: ``QUICK``), into OUT/chaos.json, and the table; stopped (SIGINT, SIGTERM), the scenarios
finished so far (``geomx.bench.alone``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..alone import add_out, chosen, run_alone
from .plan import FULL, QUICK
from .report import lines
from .section import SCENARIOS, measure


def main(argv: list[str] | None = None) -> int:
    """Parse the flags first (``--help`` and a misspelt flag start nothing), then run the chosen scenarios."""
    parser = argparse.ArgumentParser(prog="python -m geomx.bench.chaos",
                                     description="the chaos section's scenarios (geomx bench --only chaos runs "
                                                 "every one)")
    parser.add_argument("scenarios", nargs="*", metavar="SCENARIO",
                        help=f"run only these (default: every one): {', '.join(SCENARIOS)}")
    parser.add_argument("--quick", action="store_true", help="the shorter plan (QUICK)")
    add_out(parser, "chaos")
    args = parser.parse_args(argv)
    scenarios = chosen(parser, args.scenarios, SCENARIOS, "scenario", tuple(SCENARIOS))
    out_dir = Path(args.out)
    return run_alone("chaos", lambda: measure(scenarios, QUICK if args.quick else FULL, out_dir), out_dir, lines)


if __name__ == "__main__":
    sys.exit(main())
