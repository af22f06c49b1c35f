"""The worker's plug-ins by name: how ``geomx.worker.compose`` builds the ones a worker's config asks for.

A new push route (or step assigner) is one file in this package and one line here.

Usage::

    route = PUSH_ROUTES["relay"](node_config, context)
"""

from __future__ import annotations

from collections.abc import Callable

from ..config import NodeConfig
from .plugins import PushRoute, StepAssigner, WorkerContext
from .relay import relay_from_config
from .steps import state_round_steps_from_config

PUSH_ROUTES: dict[str, Callable[[NodeConfig, WorkerContext], PushRoute]] = {
    "direct": lambda config, context: PushRoute(context),
    "relay": relay_from_config,
}

STEP_ASSIGNERS: dict[str, Callable[[NodeConfig, WorkerContext], StepAssigner]] = {
    "state_round": state_round_steps_from_config,
}
