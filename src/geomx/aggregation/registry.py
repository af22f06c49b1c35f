"""The aggregations and extensions by name: how the composition root builds what a server's config asks for.

A new aggregation (or request kind of an algorithm's own) is one file in this package and one line here.

Usage::

    aggregation = AGGREGATIONS["hfa"](node_config, server)
"""

from __future__ import annotations

from collections.abc import Callable

from ..config import NodeConfig
from ..core.plugins import Aggregation, Extension, ServerHost
from .esync import state_rounds_from_config
from .hfa import hfa_from_config

AGGREGATIONS: dict[str, Callable[[NodeConfig, ServerHost], Aggregation]] = {
    "sum": lambda config, host: Aggregation(),
    "hfa": hfa_from_config,
}

EXTENSIONS: dict[str, Callable[[NodeConfig, ServerHost], Extension]] = {
    "state_rounds": state_rounds_from_config,
}
