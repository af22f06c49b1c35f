"""SSP: stale synchronous parallel, rounds answered early within a staleness bound (``dist_ssp``).

``server`` (the policy: a party may run at most ``staleness`` global rounds ahead of the slowest)."""
