"""The aggregations and extensions by name: how the composition root builds what a server's config asks for.

A new aggregation (or request kind of an algorithm's own) is one file in this package and one line here.

Usage::

    aggregation = AGGREGATIONS["hfa"].from_config(node_config, server, **options)
"""

from __future__ import annotations

from collections.abc import Callable

from ..config import NodeConfig
from ..core.plugins import Aggregation, Extension, ServerHost
from .esync import state_rounds_from_config
from .hfa import HfaAggregation

AGGREGATIONS: dict[str, type[Aggregation]] = {
    "sum": Aggregation,
    "hfa": HfaAggregation,
}

EXTENSIONS: dict[str, Callable[[NodeConfig, ServerHost], Extension]] = {
    "state_rounds": state_rounds_from_config,
}
