"""The worker side: what ``geomx.kv.KVStore`` runs besides its MXNet-shaped API.

``compose`` picks the plug-ins (their interfaces in ``geomx.core.worker_plugins``, their implementations named
in ``geomx.algorithms.registry``) once from the typed config; ``slices`` cuts a key's tensor into the slices
that travel; ``sender`` sends them (payload, codec, message) and waits for their answers, for the kvstore and a
collective rank alike; ``tier`` is the kvstore's LAN tier, beneath it: nothing in a party with a local server, a
collective party's rank otherwise, which is ``ranks`` (its process group, the slices it owns, how they meet the
global servers). ``calls`` checks the kvstore calls' arguments before anything is sent (unknown keys, unequal
key and tensor lists). ``exits`` is how a worker's process ends: the exit hook that leaves the job, and one line,
not a traceback, for errors that say the job failed elsewhere. ``kv.py`` names no algorithm: it calls these.

Usage::

    plugins = compose_worker(node_config, WorkerContext(van, requests, servers, book, me, timeout=30.0))"""
