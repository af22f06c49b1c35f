"""SSP: stale synchronous parallel, rounds answered early within a staleness bound (``dist_ssp``)."""
