"""HFA: hierarchical frequency aggregation (a local average every K1 steps, a global one every K2 local
rounds), with DiLoCo's outer optimizer and streaming fragments.

``rules`` (the local server's counting and deltas), ``server`` (the aggregation: weighted deltas up, the global
model or its change down), ``strategy`` (the PyTorch wrapper's side: local steps, the model averaged every K1),
``collective`` (a ``lan: collective`` party: inner steps data-parallel, global rounds of owned slices),
``machine`` (every global round of a collective rank: blocking in windows or overlapped on a thread, a whole
model or FSDP2 shards, any device), ``quorum`` (decoupled outer rounds: a global server's rounds closed by a quorum
and a grace window, late deltas folded in or dropped)."""
