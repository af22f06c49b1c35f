"""Whether a peer can be reached: what ZeroMQ's socket events say of one connection (nothing listens at the
address, connected, the handshake passed, the peer refused this node's credentials, or the connection dropped).

Why: a ZeroMQ DEALER connects in the background and retries forever, so a request to a scheduler nobody runs, or
to one that refused this node's shared secret, just waits, and the wait ends in a timeout that cannot say why. The
van watches the socket monitor of the peers it is asked to (the schedulers a node registers with) and keeps a
``Reach`` per peer; the registration wait reads it to name the cause early (``geomx.cluster.membership``).

Usage::

    reach = Reach("tcp://10.0.0.1:9000", mechanism="plain")
    reach.note(zmq.EVENT_HANDSHAKE_FAILED_AUTH, 400)     # the van's I/O thread, per monitor event
    reach.refusal      # "refused this node's shared secret (...)": the peer said no, waiting will not help
    reach.describe()   # "nothing listens there (connection refused, 4 tries)"
    reach.gone         # True once a peer that was connected dropped and refuses reconnecting: it stopped
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import zmq

# the events a watched connection's monitor reports (``zmq.Socket.get_monitor_socket(WATCHED_EVENTS)``)
WATCHED_EVENTS = (zmq.EVENT_CONNECTED | zmq.EVENT_CONNECT_RETRIED | zmq.EVENT_DISCONNECTED
                  | zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                  | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)

_REFUSED_CREDENTIALS = {
    "plain": "refused this node's shared secret (security.secret / GEOMX_SECRET / GEOMX_SECRET_FILE must be the "
             "same in every party)",
    "curve": "refused this node's CURVE key (its public key is not in the key folder there: copy every party's "
             "<party>.key from `geomx keygen` to every host)",
    "none": "demands credentials this node does not have (set the job's security.secret or curve_keys here too)",
}
# reconnections refused after a drop that say the peer's process is gone (ZeroMQ retries every ~0.1-0.2 s): a peer
# whose connection drops while it runs (a network hiccup) is reconnected to, not refused; one that ended is refused
GONE_TRIES = 3
# a CURVE peer that runs and drops this node's handshake again and again: its public key here is not its own (the
# server cannot open our HELLO, so it closes the connection and ZeroMQ says no more than that)
_CURVE_KEY_MISMATCH = ("drops this node's CURVE handshake ({tries} tries): this host's copy of its party's public "
                       "key (<party>.key) does not match its secret key (every host needs the *.key files of the "
                       "same `geomx keygen` run)")
_OTHER_SECURITY = ("does not speak this node's security ({mechanism}): one side has a shared secret or CURVE keys "
                   "and the other has not, or the other kind (security must be the same in every party)")


class Reach:
    """One watched connection's state, from its monitor's events (written by the I/O thread, read by any)."""

    def __init__(self, address: str, mechanism: str = "none") -> None:
        self.address = address
        self.mechanism = mechanism  # this node's: "none", "plain" or "curve" (geomx.transport.security.Guard)
        self.retries = 0  # connections refused (nothing listens) so far
        self.connected = False  # a TCP connection is up
        self.handshaken = False  # a handshake passed on the connection now up: the peer runs, took our credentials
        self.dropped = False  # a connection was up, then dropped, and no handshake has passed since
        self.refused_since_drop = 0  # reconnections refused since the drop (nothing listens there any more)
        self.refusal: str | None = None  # the peer refused this node: waiting will not help
        self._retried_since_drop = 0  # ZeroMQ's first retry after a drop only schedules the reconnection
        self._failed_handshakes = 0  # CURVE handshakes the peer closed without a word, since the last that passed
        self._lock = threading.Lock()

    def note(self, event: int, value: int) -> None:
        """One monitor event (``value``: the ZAP status code for an authentication failure)."""
        with self._lock:
            if event == zmq.EVENT_CONNECT_RETRIED:
                self.retries += 1
                self.connected = False
                if self.dropped:
                    self._retried_since_drop += 1
                    self.refused_since_drop = max(0, self._retried_since_drop - 1)
            elif event == zmq.EVENT_CONNECTED:
                self.connected = True
            elif event == zmq.EVENT_DISCONNECTED:
                # the peer closed the connection (it stopped, or crashed): it no longer runs as far as we know
                self.dropped = self.dropped or self.connected or self.handshaken
                self.connected = self.handshaken = False
                self._retried_since_drop = self.refused_since_drop = 0
            elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.handshaken, self.refusal, self.dropped = True, None, False
                self._failed_handshakes = 0
            elif event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL and self.mechanism == "curve":
                # (a peer that stopped refuses the reconnection; one that accepts it and drops the handshake runs)
                self._failed_handshakes += 1
                if self._failed_handshakes >= GONE_TRIES:
                    self.refusal = _CURVE_KEY_MISMATCH.format(tries=self._failed_handshakes)
            elif event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                self.refusal = _REFUSED_CREDENTIALS.get(self.mechanism, _REFUSED_CREDENTIALS["none"])
            elif event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL and not (self.handshaken or self.dropped):
                # (not a peer that took this node before: a connection cut mid-handshake as it stops)
                self.refusal = _OTHER_SECURITY.format(mechanism=self.mechanism.upper())

    @property
    def gone(self) -> bool:
        """The peer was connected, the connection dropped, and nothing listens there since: its process ended."""
        with self._lock:
            return self.dropped and not self.connected and self.refused_since_drop >= GONE_TRIES

    def describe(self) -> str:
        """Why a request to this peer may still be unanswered, in words."""
        with self._lock:
            if self.refusal is not None:
                return self.refusal
            if self.handshaken:
                return "it runs (connected, handshake passed) and has not answered yet"
            if self.connected:
                return "connected, but the handshake has not completed"
            if self.dropped:
                since = f"; nothing listens there since (connection refused, {self.refused_since_drop} tries)" \
                    if self.refused_since_drop else ""
                return f"it was connected, then the connection dropped{since}"
            if self.retries:
                return f"nothing listens there (connection refused, {self.retries} tries)"
            return "no connection yet (no answer to connecting: a firewall, or a wrong address?)"


class BindError(OSError):
    """A node cannot listen at its address (in use, or not this host's): one line names it, no traceback."""

    @classmethod
    def of(cls, name: str, address: str, exc: zmq.ZMQError) -> BindError:
        """``name`` could not bind ``address`` (HOST:PORT) for ``exc``, in words."""
        in_use = " (is another job, or an old process of this one, still running there?)" \
            if exc.errno == zmq.EADDRINUSE else ""
        return cls(f"{name} cannot listen at {address}: {zmq.strerror(exc.errno)}{in_use}")


class Watches:
    """The van's watched connections: a ``Reach`` per peer, fed by its DEALER's monitor socket (the I/O thread
    attaches, drains and closes them; any thread reads ``reaches``).

    Usage (inside the van)::

        watches.expect("global_scheduler", "tcp://10.0.0.1:9000")   # add_peer(..., watch=True)
        watches.attach("global_scheduler", dealer, poller)          # before dealer.connect()
        watches.drain(dict(poller.poll(200)))                      # each turn of the I/O loop
    """

    def __init__(self, mechanism: str) -> None:
        self.mechanism = mechanism
        self.reaches: dict[str, Reach] = {}
        self._monitors: dict[zmq.Socket[Any], Reach] = {}

    def expect(self, identity: str, address: str) -> None:
        self.reaches[identity] = Reach(address, self.mechanism)

    def attach(self, identity: str, sock: zmq.Socket[Any], poller: zmq.Poller | None) -> None:
        """Monitor ``sock`` if ``identity`` is watched (call before ``sock.connect``: its first events count)."""
        reach = self.reaches.get(identity)
        if reach is not None and poller is not None:
            monitor = sock.get_monitor_socket(WATCHED_EVENTS)
            self._monitors[monitor] = reach
            poller.register(monitor, zmq.POLLIN)

    def drain(self, events: Mapping[Any, int]) -> None:
        """Read the pending events of every monitor that ``events`` (a poll's result) says is readable."""
        # imported here: zmq.utils.monitor imports asyncio (~0.05 CPU-s), which only a watching node pays
        from zmq.utils.monitor import recv_monitor_message

        for monitor, reach in self._monitors.items():
            for _ in range(64 if monitor in events else 0):
                try:
                    event = recv_monitor_message(monitor, flags=zmq.NOBLOCK)
                except zmq.Again:
                    break
                reach.note(int(event["event"]), int(event["value"]))

    def close(self) -> None:
        for monitor in self._monitors:
            monitor.close(linger=0)
        self._monitors.clear()
