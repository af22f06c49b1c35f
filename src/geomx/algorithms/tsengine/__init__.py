"""TSEngine: pushes and answers relayed among members over an overlay, to spread the load off one link.

``rules`` (the overlays: who sends a round's pushes and result to whom, from measured throughput), ``kinds`` (the
message kind its relays travel under), ``server`` (TSEngine as a server's route), ``member`` (a worker's part
inside a party: hold, merge, relay), ``worker`` (``member``'s protocol as the worker core's push route)."""
