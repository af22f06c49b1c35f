"""The routes by name: how the composition root builds the one a server's config asks for.

A new route is one file in this package and one line here.

Usage::

    route = ROUTES["tsengine"](node_config, server)
"""

from __future__ import annotations

from collections.abc import Callable

from ..config import NodeConfig
from ..core.plugins import Route, ServerHost
from .dgt import dgt_from_config
from .tsengine import tsengine_from_config

RouteFactory = Callable[[NodeConfig, ServerHost], Route]

ROUTES: dict[str, RouteFactory] = {
    "direct": lambda config, host: Route(),
    "tsengine": tsengine_from_config,
    "dgt": dgt_from_config,
}
