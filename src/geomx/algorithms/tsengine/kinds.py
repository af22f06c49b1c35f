"""TSEngine's own message kind: the wire format knows no algorithm, so TSEngine declares the number its relays
travel under (``geomx.protocol.wire.PluginKind``; the registry checks that no other algorithm took it).

Usage::

    van.send(server, Message(RELAY, key=3, body={"ask": True}))
    if message.kind == RELAY: ...      # ==, never ``is``: a received RELAY is an unnamed PluginKind(33)
"""

from __future__ import annotations

from ...protocol.wire import PluginKind

# between servers, or a local server and its workers: a round's result handed on, an ask where a held push
# should go, an instruction to push or pass on, or an ack (the body says which; ``member.py``, ``server.py``)
RELAY = PluginKind(33, "tsengine.relay")
