"""The worker side: what ``geomx.kv.KVStore`` runs besides its MXNet-shaped API.

``compose`` picks the plug-ins (their interfaces in ``geomx.core.worker_plugins``, their implementations named
in ``geomx.algorithms.registry``) once from the typed config; ``slices`` cuts a key's tensor into the slices
that travel; ``ranks`` is a collective party's rank as the kvstore sees it (its process group, the slices it
owns, how they meet the global servers). ``kv.py`` names no algorithm: it calls these.

Usage::

    plugins = compose_worker(node_config, WorkerContext(van, requests, servers, book, me, timeout=30.0))"""
