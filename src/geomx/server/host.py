"""What the parts of a parameter server share: the server process (``geomx.server.process``) as they see it.

The parts (``departures``, ``configure``, ``upstream``, ``pushpull``) each handle one kind of event and reach
the server's state and its other parts through this protocol, not through the class itself, so that no part
imports the process module (no import circle, type-checking imports included) and a unit test may pass a
fake.

Usage (a part's constructor)::

    class Departures:
        def __init__(self, host: PartHost) -> None: self.host = host
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Protocol

from ..codecs import Registry
from ..config import NodeConfig, Timeouts
from ..core.early import EarlyAnswers
from ..core.encoding import Encoding
from ..core.inits import Inits
from ..core.plugins import Aggregation, Extension, PluginHost, Route
from ..optim import Optimizer
from ..protocol.wire import Message
from ..runs.checkpoint import CheckpointWriter, Snapshot
from ..transport.rpc import Requests


class PartHost(PluginHost, Protocol):
    """The server process, as its parts see it: what a plug-in may ask of it (``PluginHost``), and more."""

    config: NodeConfig
    is_global: bool  # a global server (top tier) rather than a party's local server
    requests: Requests
    timeouts: Timeouts
    lock: threading.RLock  # every part's state changes under it
    inits: Inits
    route: Route
    aggregation: Aggregation
    extensions: list[Extension]
    encoding: Encoding
    codecs: Registry  # decodes whatever arrives, by the payload's codec id
    early_answers: EarlyAnswers  # a local server's early answers (geomx.core.early)
    optimizer: Optimizer | None  # a global server's, once the master set one
    resumed: Snapshot | None  # the checkpoint a global server started from (--resume)
    checkpoints: CheckpointWriter | None
    configurers: set[str]  # clients allowed to configure the servers (the master worker's path)

    def when_all(self, futures: list[Future[Message]], then: Callable[[str | None], None]) -> None: ...

    def stop_fatally(self, text: str) -> None: ...

    def all_done(self) -> None: ...
