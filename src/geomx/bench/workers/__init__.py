"""Worker scripts that ``geomx bench`` starts through the launcher (``python -m geomx.bench.workers.X``).

The WAN section's (``geomx.bench.wan``): ``wan_geomx`` (the job under geomx's kvstore loop), ``wan_torch`` (the
job through the PyTorch wrapper), ``ddp`` (the job under DDP, or DDP with local SGD), ``diloco`` (the job under
torchft's DiLoCo). The others': ``transport`` (``kv.pushpull`` timed), ``gloo`` (gloo's ``all_reduce`` timed),
``frontend`` (the front-end section's CNN loops), ``lan_step`` (one party's step under each LAN tier),
``scale_step`` (the scale job's loop on one rank), ``quality`` (the quality section's
character-transformer rows), ``chaos`` (the chaos section's parties, one of them slowed); ``teardown`` (how a
worker that ran DDP ends)."""
