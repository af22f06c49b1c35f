"""The transport: how messages travel between nodes, knowing nothing of what a key means.

``van`` (ZeroMQ sockets, the I/O thread), ``frames`` (one multipart message in and out of a socket),
``dispatch`` (handing received messages to the node), ``links`` (which emulated link a peer sits behind),
``emulator`` (rate, delay, loss, outages), ``counters`` (bytes per link class), ``udp`` (datagram channels, for
DGT), ``security`` (shared secret and CURVE keys), ``reach`` (whether a peer can be reached, from ZeroMQ's socket
events), ``trace`` (a debug log of messages), ``rpc`` (requests tracked until their answers arrive, each with a
timeout), ``shutdown`` (whether an I/O thread's error is only ZeroMQ going away under a van being shut down)."""
