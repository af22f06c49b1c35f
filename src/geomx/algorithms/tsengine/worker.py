"""The push route of TSEngine inside a party (``ENABLE_INTRA_TS``): pushes wait for the local server's word
on where they go, values come relayed by fellow workers. The protocol is ``member.RelayMember``'s;
this adapts it to the worker core's ``PushRoute``.

Usage::

    route = relay_from_config(node_config, context)     # ROUTES["relay"] in geomx.algorithms.registry
    future = route.push(server, Message(Kind.PUSHPULL, key=3, tensor=grad))
"""

from __future__ import annotations

from concurrent.futures import Future

import numpy as np

from ...config import NodeConfig, Role
from ...core.worker_plugins import PushRoute, WorkerContext
from ...protocol.wire import Message
from .member import RelayMember


class RelayRoute(PushRoute):
    """Pushes held by a ``RelayMember`` until the party's local server says where they go."""

    copies = True  # the member holds a copy of every push
    carries_codecs = False  # the relays sum float32 tensors

    def __init__(self, context: WorkerContext, member: RelayMember) -> None:
        super().__init__(context)
        self.member = member

    def push(self, server: str, message: Message) -> Future[Message]:
        if message.tensor is None:
            raise ValueError(f"push of key {message.key} slice {message.slice}: the relay route carries a tensor")
        data = np.asarray(message.tensor)
        return self.member.push(message.key, message.slice, message.num_slices, data, message.priority)

    def handles(self, message: Message) -> bool:
        return self.member.handles(message)


def relay_from_config(config: NodeConfig, context: WorkerContext) -> PushRoute:
    """Connect to the party's fellow workers and relay through them (the local server coordinates)."""
    fellows = [m for m in context.book.of_role(Role.WORKER) if m.id != context.me.id]
    for fellow in fellows:
        context.van.add_peer(fellow.id, fellow.address, fellow.party)
    relay = RelayMember(context.van, context.requests, context.servers[0], {m.id for m in fellows}, context.me.name)
    return RelayRoute(context, relay)
