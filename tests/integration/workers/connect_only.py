"""Integration worker that only joins the job (used to test what happens when the scheduler is missing)."""

import geomx

kv = geomx.kv.create("dist_sync")
print(f"joined as {kv.name}", flush=True)
kv.close()
