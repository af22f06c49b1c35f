"""MixedSync: synchronous inside a party, asynchronous between parties (``dist_async``).

``server`` (the global tier's policy: every push is its own round, applied and answered on arrival)."""
