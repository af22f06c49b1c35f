"""FSA: every round of pushes waits for every contributor (``dist_sync``)."""
