"""The server core: rounds, clients and the interfaces that algorithms plug into. It knows no algorithm.

``rounds`` (the round table: collect, sum, release per kind, key and slice), ``round_times`` (how long rounds of
pushes took), ``clients`` (who a server serves, who left, was dropped or rejoined), ``joiners`` (a rejoined client held
until the round of pushes under way ends), ``policy`` (the sync policy's interface: when a round is complete),
``plugins`` (the interfaces of a server's plug-ins: aggregation, route, ``PluginHost``), ``worker_plugins`` (the worker
core's: push routes and the rest), ``capabilities`` (what a plug-in declares to the job), ``options`` (plug-in options
parsed for the plug-in that declares them), ``strategy`` (the PyTorch wrapper's per-algorithm seam), ``ranks`` (what a
strategy reaches of its kvstore and its party's ranks), ``encoding`` (the codec slot: which codec a value travels
with), ``early`` (early answers under FSA: the one client, two settle policies), ``inits`` (INIT: a key's first value
and which shard holds each slice), ``sharding`` (how a tensor is cut into slices and placed on the global servers),
``checkpoints`` (a top-tier server's checkpoints, tied to its rounds)."""
