"""Fakes shared by the unit tests of the server core and its plug-ins (no sockets, one process)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import numpy as np
import pytest

from geomx.algorithms.fsa.server import FullySynchronous
from geomx.codecs import TensorInfo
from geomx.codecs.base import Direction, TensorKind
from geomx.core.clients import Clients
from geomx.core.rounds import Round, RoundTable, SliceValue
from geomx.protocol.wire import Message


class FakeServer:
    """A server host that records what it sends, refuses and forwards; rounds complete into ``completed``."""

    def __init__(self, identity: str, clients: list[str], upstream: list[str] = (), peers: set[str] = ()) -> None:
        self.name = identity
        self.identity = identity
        self.clients = Clients(clients)
        self.upstream = list(upstream)
        self.peers = set(peers)
        self.stored: dict[tuple[int, int], SliceValue] = {(0, 0): SliceValue(np.zeros(4, dtype=np.float32))}
        self.table = RoundTable(self, self.clients, FullySynchronous())
        self.sent: list[tuple[str, Message]] = []
        self.refused: list[str] = []
        self.forwarded: list[Message] = []
        self.released: list[tuple[Any, ...]] = []
        self.completed: list[Round] = []
        self.wan_codec: Any = None
        self.tensor_sizes: dict[int, int] = {}  # key -> its whole tensor's elements, as INIT would have said
        self.calls: list[tuple[str, Message, Callable[[Future[Message]], None]]] = []

    def send(self, peer: str, message: Message) -> None:
        self.sent.append((peer, message))

    def refuse(self, message: Message, text: str) -> None:
        self.refused.append(text)

    def display(self, client: str) -> str:
        return client

    def release(self, rnd: Round, value: np.ndarray | None, error: str | None = None, number: int | None = None,
                body: dict[str, Any] | None = None, fields: dict[str, Any] | None = None) -> None:
        self.released.append((rnd.number, value, error, number))
        self.table.release(rnd, value, error, number, body, fields)

    def forward(self, rnd: Round, message: Message) -> None:
        self.forwarded.append(message)

    def owner(self, key: int, index: int) -> str:
        return self.upstream[0] if self.upstream else "gs"

    def tensor_info(self, key: int, index: int, kind: TensorKind, direction: Direction) -> TensorInfo:
        return TensorInfo(key, index, kind, direction, self.tensor_sizes.get(key))

    def call(self, peer: str, message: Message, then: Callable[[Future[Message]], None]) -> None:
        self.calls.append((peer, message, then))

    def complete(self, rnd: Round) -> None:
        self.completed.append(rnd)

    def redeliver(self, message: Message) -> None:
        self.table.contribute(message)

    def all_done(self) -> None:
        pass




@pytest.fixture
def make_server() -> Callable[..., FakeServer]:
    """``make_server(identity, clients, upstream=[], peers=set())``: a fake server host."""
    return FakeServer
