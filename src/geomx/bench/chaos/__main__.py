"""``python -m geomx.bench.chaos [SCENARIO ...] [--quick]``: the chosen scenarios (default: every one) at ``FULL``
(``--quick``: ``QUICK``), into bench-results/chaos.json, and the table."""

from __future__ import annotations

import sys
from pathlib import Path

from ..tables import write_and_print
from .plan import FULL, QUICK
from .report import lines
from .section import SCENARIOS, measure

chosen = tuple(a for a in sys.argv[1:] if not a.startswith("--")) or tuple(SCENARIOS)
write_and_print("chaos", measure(chosen, QUICK if "--quick" in sys.argv else FULL, Path("bench-results")),
                Path("bench-results"), lines)
