"""MixedSync: synchronous inside a party, asynchronous between parties (``dist_async``)."""
