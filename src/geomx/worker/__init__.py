"""The worker side: what ``geomx.kv.KVStore`` runs besides its MXNet-shaped API.

``plugins`` holds the interfaces the worker core owns (how a push travels, how local steps are assigned),
``registry`` names their implementations, ``compose`` picks them once from the typed config, ``slices`` cuts
a key's tensor into the slices that travel. ``kv.py`` names no algorithm: it calls these.

Usage::

    plugins = compose_worker(node_config, WorkerContext(van, requests, servers, book, me, timeout=30.0))
"""
