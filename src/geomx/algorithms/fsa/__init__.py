"""FSA: every round of pushes waits for every contributor (``dist_sync``).

``server`` (the sync policy: a round completes when every awaited client pushed), ``strategy`` (the PyTorch
wrapper's side: gradients leave from autograd hooks), ``collective`` (a ``lan: collective`` party: reduce-scatter,
each rank syncs its owned slices, all-gather), ``sharded`` (the same under FSDP2: each rank syncs its shards)."""
