"""``geomx bench``: geomx measured against its baselines, side by side in one run, one section per module.

``sections.py`` is the table of sections (``geomx bench --only NAME``); each section module has ``run`` and
``lines``; ``jobs.py`` runs jobs and reads their records, ``tables.py`` formats, ``targets.py`` finds the
time to a target accuracy, ``runner.py`` runs the chosen sections and writes OUT/bench.json. See
``benchmarks/README.md`` for how to read each table. Nothing here asserts.

Usage::

    geomx bench --quick              # every section but wan (wan needs root: --only wan)
    geomx bench --out bench-results  # the full run
    geomx bench --only transport --only sync
"""
