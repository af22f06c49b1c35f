"""The parameter server: a party's local server or a global server (see ``geomx.server.process``).

Usage::

    from geomx.server import ParameterServer
    ParameterServer(node_config).run()
"""

from .process import ParameterServer

__all__ = ["ParameterServer"]
