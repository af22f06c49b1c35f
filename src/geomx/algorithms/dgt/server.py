"""DGT (Differential Gradient Transmission) as a route: how a local server's sum travels up to its global server.

A local server sends each push's important blocks in the reliable request and the rest as paced UDP
datagrams to the owning global server's UDP endpoint (its ZeroMQ port number); the global server reassembles
each push (blocks that missed the deadline are zeros) before it joins its round, and tells each sender in its
answers what its datagrams did, which adaptive K follows. The mechanics are ``datagrams.py``; this file plugs
them into a server through the route hooks.

Usage (the composition root, for a topology with ``dgt``)::

    route = dgt_from_config(node_config, server)
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from ...config import DGTSpec, NodeConfig, Role
from ...core.plugins import PluginHost, Route
from ...core.rounds import Round
from ...protocol.wire import Kind, Message
from ...transport.udp import Datagram, UdpReceiver
from .datagrams import DgtAssembler, DgtError, DgtSender, write_report
from .feedback import FEEDBACK_KEY

log = logging.getLogger("geomx.server")


def udp_endpoint(address: str) -> tuple[str, int]:
    """``tcp://HOST:PORT`` -> (HOST, PORT): a global server's DGT UDP socket uses its ZeroMQ port number."""
    host, _, port = address.removeprefix("tcp://").rpartition(":")
    return host, int(port)


class DgtRoute(Route):
    """A local server: sends the minor blocks by UDP. A global server: reassembles, answers with feedback."""

    answers_plain_sums = False  # a push travels as blocks on several channels, not as one request

    def __init__(self, host: PluginHost, spec: DGTSpec, is_global: bool, bind_host: str) -> None:
        self.host = host
        self.spec = spec
        self.is_global = is_global
        self.bind_host = bind_host
        self.sender: DgtSender | None = None
        self.assembler: DgtAssembler | None = None
        self.udp: UdpReceiver | None = None

    def start(self) -> None:
        """A global server listens for UDP blocks on its ZeroMQ port number; a local server starts pacing."""
        spec, van = self.spec, self.host.van
        if self.is_global:
            self.assembler = DgtAssembler(spec.deadline_s)
            _, port = udp_endpoint(van.address)
            # each datagram is counted, and passes the party's access link behind the messages, before it is handled
            received = lambda d: van.receive_datagram(d.sender, d.nbytes, lambda: self._on_datagram(d))  # noqa: E731
            self.udp = UdpReceiver(self.bind_host, port, received, self._on_tick, name=self.host.name)
            self.udp.start()
        else:  # the datagrams share the van's links (behind its messages) and byte counters
            self.sender = DgtSender(spec, self.host.identity, van)
        log.info("[%s] DGT on: K=%g%s, %d UDP channels, %d-byte blocks", self.host.name, spec.k,
                 " (adaptive)" if spec.adaptive else "", spec.channels, spec.block_bytes)

    # -- a local server -----------------------------------------------------------------------------------
    def send_up(self, rnd: Round, fields: dict[str, Any]) -> bool:
        upward = fields.get("tensor")
        if self.sender is None or not isinstance(upward, np.ndarray) or upward.dtype != np.float32:
            return False
        owner = self.host.owner(rnd.key, rnd.slice)
        first = next(iter(rnd.contributions.values()))
        fields = self.sender.push(owner, udp_endpoint(self.host.upstream_addresses[owner]), rnd.key, rnd.slice,
                                  rnd.number, upward)
        self.host.forward(rnd, Message(Kind.PUSHPULL, key=rnd.key, slice=rnd.slice, num_slices=first.num_slices,
                                       round=rnd.number, priority=first.priority, **fields))
        return True

    def answer_arrived(self, reply: Message) -> None:
        if self.sender is not None:  # the receiver's loss report, which adaptive K follows
            self.sender.on_answer(reply.body)

    # -- a global server ----------------------------------------------------------------------------------
    def holds(self, message: Message) -> bool:
        if self.assembler is None or message.kind is not Kind.PUSHPULL or "dgt" not in (message.body or {}):
            return False
        try:
            done = self.assembler.on_reliable(message.sender.decode(), message, time.monotonic())
        except DgtError as exc:
            self.host.refuse(message, f"DGT push of key {message.key} slice {message.slice}: {exc}")
            return True
        if done is not None:
            self.host.push(done)
        return True

    def outgoing(self, peer: str, message: Message) -> None:
        if self.assembler is not None and message.kind is Kind.PUSHPULL and message.is_reply:
            feedback = self.assembler.feedback_for(peer)
            if feedback is not None:  # what this sender's UDP blocks did (see geomx.algorithms.dgt.feedback)
                message.body = {**(message.body or {}), FEEDBACK_KEY: feedback}

    def _on_datagram(self, datagram: Datagram) -> None:
        """A UDP block (the receiver or dispatch thread): a push whose last block this was joins its round."""
        def handle() -> None:
            if self.assembler is None or datagram.sender not in self.host.clients:
                return
            done = self.assembler.on_block(datagram)
            if done is not None:
                self.host.push(done)

        self.host.locked(handle)

    def _on_tick(self, now: float) -> None:
        """Deadlines (the receiver thread): pushes still missing blocks join their rounds with zeros there."""
        def expire() -> None:
            assert self.assembler is not None
            deadline = self.assembler.next_deadline()
            if deadline is None or deadline > now:
                return
            for done in self.assembler.expire(now):
                self.host.push(done)

        if self.assembler is not None:
            self.host.locked(expire)

    # -- both ---------------------------------------------------------------------------------------------
    def close(self) -> None:
        if self.udp is not None:
            self.udp.stop()

    def stop(self, run_dir: Path | None) -> None:
        report = None
        if self.sender is not None:
            report = self.sender.report()
        if self.udp is not None:
            report = {"name": self.host.name, **(self.assembler.report() if self.assembler else {}),
                      "malformed": self.udp.malformed}
            for entry in report.get("missing", []):
                entry[0] = self.host.display(entry[0])
        if report is not None and run_dir is not None:
            write_report(run_dir, self.host.name, report)


def dgt_from_config(config: NodeConfig, host: PluginHost) -> Route:
    """The DGT route of a server whose topology turns DGT on."""
    assert config.topology.dgt is not None
    return DgtRoute(host, config.topology.dgt, config.role is Role.GLOBAL_SERVER, config.bind_host)
