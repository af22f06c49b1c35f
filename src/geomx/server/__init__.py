"""The parameter server: a party's local server or a global server (see ``geomx.server.process``).

``process`` (the server process: the round machinery per key and slice), ``host`` (what its parts share of it),
its parts: ``pushpull`` (rounds of pushes, up a tier or applied), ``bundles`` (a client's PUSHPULLs as one
message: split into the usual rounds, answered as one), ``upstream`` (requests to the servers above),
``configure`` (CONFIGURE: the optimizer, sync policy and codec the master worker sends), ``departures`` (clients
that die, leave or come back); ``compose`` (the composition root: the plug-ins it runs, from its typed config);
``heap`` (the process keeps the memory it frees: each round's large arrays reuse the last round's).

Usage::

    from geomx.server import ParameterServer
    ParameterServer(node_config).run()"""

from .process import ParameterServer

__all__ = ["ParameterServer"]
