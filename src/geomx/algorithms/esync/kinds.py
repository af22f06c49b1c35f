"""ESync's own message kind: the wire format knows no algorithm, so ESync declares the number its speed reports
travel under (``geomx.protocol.wire.PluginKind``; the registry checks that no other algorithm took it).

Usage::

    future = requests.call(server, Message(STATE, body=encode_body(report)))
    handlers = {STATE: on_state}       # a received report's kind (an unnamed PluginKind(32)) finds on_state
"""

from __future__ import annotations

from ...protocol.wire import PluginKind

# worker -> servers: a speed report (JSON ``bodies.StateReport``), merged up the tree as a round; reply: each
# worker's local steps (``bodies.StepAssignment``)
STATE = PluginKind(32, "esync.state")
