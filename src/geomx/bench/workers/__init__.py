"""Worker scripts that ``geomx bench`` starts through the launcher (``python -m geomx.bench.workers.X``)."""
