"""CONFIGURE: the settings the master worker sends the servers once the job runs (``kv.set_optimizer``,
``kv.create``'s sync type, ``kv.set_gradient_compression``).

A global server builds the server optimizer (and reports a bad spec), takes the sync policy from the registry
and the WAN codec, and spreads the codec to every party's local server (each encodes its pushes with it); a
local server forwards the settings up (its own tier stays synchronous) and takes the codec when its global
server spreads it. Settings that do not combine with the job are refused by the one table of such rules
(``geomx.config.combinations``).

Usage (the server's handler for the kind)::

    handlers[Kind.CONFIGURE] = Configure(server).on_configure
"""

from __future__ import annotations

import logging
from typing import Any

from ..algorithms.registry import SYNCHRONOUS
from ..config import Mode
from ..config.combinations import configure_facts, refusal
from ..core.checkpoints import restore_optimizer
from ..optim import Optimizer, optimizer_from_spec
from ..protocol.bodies import BodyError, ConfigureBody, decode_body, encode_body
from ..protocol.wire import Kind, Message
from .compose import DEFAULT_SYNC, configured_policy
from .host import PartHost

log = logging.getLogger("geomx.server")


def build_optimizer(spec: Any) -> Optimizer:
    """The server optimizer ``spec`` names (NumPy only: a global server never imports torch for it).

    Usage: ``optimizer = build_optimizer({"name": "sgd", "params": {"lr": 0.1}})``.
    """
    return optimizer_from_spec(spec)


class Configure:
    """A server's CONFIGURE handler (see the module docstring)."""

    def __init__(self, host: PartHost) -> None:
        self.host = host

    def on_configure(self, message: Message) -> None:
        """Server settings from the master worker: {"optimizer": spec}, {"sync": kvstore type} and/or
        {"compression": codec spec}; from a global server: {"compression": ...} only."""
        host = self.host
        sender = message.sender.decode()
        from_upstream = sender in host.upstream  # a global server spreading the compression to every party
        if sender not in host.configurers and not from_upstream:
            host.refuse(message, "only the master worker may configure the servers")
            return
        try:
            settings = decode_body(ConfigureBody, message.body)
        except BodyError as exc:
            host.refuse(message, f"CONFIGURE takes 'optimizer', 'sync' and/or 'compression': {exc}")
            return
        given = sorted(encode_body(settings))
        if not given:
            host.refuse(message, "CONFIGURE takes 'optimizer', 'sync' and/or 'compression', got none")
            return
        if from_upstream and given != ["compression"]:
            host.refuse(message, "a global server may only spread the compression setting")
            return
        try:
            # the global servers build the optimizer (and report a bad spec); a local server only forwards it
            wanted = settings.optimizer is not None and host.is_global
            optimizer = build_optimizer(settings.optimizer) if wanted else None
            options = dict(host.config.topology.training.plugin_options)
            policy = configured_policy(settings.sync, options) if settings.sync is not None else None
            codec = host.codecs.make_codec(settings.compression) if settings.compression is not None else None
        except ValueError as exc:  # CodecError is a ValueError too
            host.refuse(message, str(exc))
            return
        facts = configure_facts(host.config.topology.features, compression=codec is not None,
                                other_sync=policy is not None and policy.name != DEFAULT_SYNC)
        # an asynchronous kv.create where the topology needs a synchronous sync (the rules name which): the
        # wrapper's plan refuses it at launch, a kvstore script only here
        facts["asynchronous_sync"] = policy is not None and not policy.synchronous
        refused = refusal(facts, sync=policy.name if policy is not None else None, synchronous=SYNCHRONOUS)
        if refused is not None:
            host.refuse(message, refused)
            return
        if codec is not None:
            assert settings.compression is not None
            host.encoding.set_wan(codec, settings.compression)
            log.info("[%s] WAN compression: %r", host.name, codec)
        if from_upstream:
            host.van.send(sender, message.reply())
            return
        if not host.is_global:  # the local tier stays synchronous; the global servers take the settings
            self._ask_and_answer(host.upstream, settings, message)
            return
        if optimizer is not None:
            self._install(optimizer, settings.optimizer)
        if policy is not None:
            host.table.policy = policy
            log.info("[%s] synchronization: %s", host.name, policy.name)
        others = [c for c in host.clients if c != sender and host.config.topology.mode is Mode.HIPS
                  and c not in host.clients.parties]  # a collective party's ranks hear of it otherwise
        if codec is None or not others:
            host.van.send(sender, message.reply())
            return
        # Every party's local server encodes its pushes: spread the setting (GeoMX's GS does the same).
        self._ask_and_answer(others, ConfigureBody(compression=settings.compression), message)

    def _install(self, optimizer: Optimizer, spec: Any) -> None:
        """Make ``optimizer`` this global server's; it learns what every client holds now (set after INIT, so
        every client holds the current value), and takes the checkpoint's state when the job resumed."""
        host = self.host
        if host.optimizer is not None and host.resumed is not None and host.optimizer.spec() == optimizer.spec():
            log.info("[%s] optimizer set: %s (the checkpoint's, in place since the resume)", host.name, spec)
            return
        if host.optimizer is not None:
            log.warning("[%s] replacing optimizer %s (its state is dropped)", host.name, host.optimizer.name)
        host.optimizer = optimizer
        log.info("[%s] optimizer set: %s", host.name, spec)
        for sid, stored in host.stored.items():
            for client in host.clients.remaining():
                optimizer.received(sid, client, stored.value)
        restore_optimizer(host.name, host.resumed, optimizer)

    def _ask_and_answer(self, servers: list[str], settings: ConfigureBody, message: Message) -> None:
        """Send ``settings`` as CONFIGURE to ``servers``; answer ``message`` once all have (naming any error)."""
        host = self.host
        sender = message.sender.decode()
        body = encode_body(settings)
        futures = [host.requests.call(server, Message(Kind.CONFIGURE, body=body)) for server in servers]
        host.when_all(futures, lambda error: host.van.send(sender, message.error(error) if error else message.reply()))
