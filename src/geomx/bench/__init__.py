"""``geomx bench``: geomx measured against its baselines, side by side in one run, one section per module.

``sections.py`` is the table of sections (``geomx bench --only NAME``); each section module has ``run`` and
``lines``; ``jobs.py`` runs jobs and reads their records, ``tables.py`` formats, ``targets.py`` finds the
time to a target accuracy, ``runner.py`` runs the chosen sections and writes OUT/bench.json, ``alone.py`` runs
one section's own entry point (``python -m geomx.bench.NAME``), stopped as ``geomx bench`` stops. See
``benchmarks/README.md`` for how to read each table. Nothing here asserts.

The sections: ``training`` (HiPS against a flat PS), ``transport`` (pushpull against gloo), ``emulation`` (the
WAN emulator's achieved rate), ``sync`` (every algorithm, time to a target), ``codecs`` (every WAN codec),
``frontend`` (the wrapper's overlap, P3), ``sched`` (MultiGPS, DGT, TSEngine), ``security`` (what a secret and
CURVE cost), ``quality`` (validation loss and WAN bytes per parameter at equal tokens; ``quality_rows``: its
budget and rows), ``lan`` (one party's step under each LAN tier), ``wan`` (a folder: against DDP, local SGD and
DiLoCo on a kernel-shaped link),
``scale`` (the 85M job's utilization, with ``standin``: the accelerator stand-in), ``chaos`` (a folder: a slow or
lost data center, a lost rank of a collective party, a lost global tier resumed: what each costs), ``recovery``
(a lost party's restart at 85M, in parts).
``workers`` holds the processes the sections start.

Usage::

    geomx bench --quick              # the default sections (sections.py; the others by name: --only wan)
    geomx bench --out bench-results  # the full run
    geomx bench --only transport --only sync"""
