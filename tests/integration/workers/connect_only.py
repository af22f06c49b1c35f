"""Integration worker that only joins the job (used to test what happens when the scheduler is missing). It says
when it starts to join (``time.monotonic()``, one clock for every process on the host), so a test can tell its wait
from its start, whose length the machine's load sets."""

import time

import geomx

print(f"joining at {time.monotonic()!r}", flush=True)
kv = geomx.kv.create("dist_sync")
print(f"joined as {kv.name}", flush=True)
kv.close()
