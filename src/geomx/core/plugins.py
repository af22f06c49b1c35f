"""The interfaces the server core owns for what plugs into a server (see docs/architecture.md).

A *route* decides how a value travels up and down (this base class is the direct route); ``PluginHost`` is
what a plug-in may ask of the server. The core imports no implementation: the composition root hands it
one, chosen from the typed config. (The sync policy's interface is ``geomx.core.policy``.)

Usage::

    class Overlay(Route):
        def handlers(self): return {OVERLAY: self.on_overlay_message}   # OVERLAY = PluginKind(40, "overlay")
        def send_down(self, rnd, value): ...; return True   # the overlay answers the contributors
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ..codecs import Codec, TensorInfo
from ..codecs.base import Direction, TensorKind
from ..config import NodeConfig, Topology
from ..protocol.wire import Message, MessageKind, SliceId
from ..transport.van import Van
from .capabilities import Capabilities, all_answer_plain_sums
from .clients import Clients
from .rounds import Round, RoundRule, RoundTable, SliceValue

Handler = Callable[[Message], None]
Completion = Callable[[Round], None]

class PluginHost(Protocol):
    """What a plug-in may ask of the server it is plugged into (a fake one in unit tests)."""

    name: str
    identity: str
    clients: Clients
    upstream: list[str]  # the servers of the tier above (none on the top tier)
    peers: set[str]  # fellow servers of this tier
    stored: dict[SliceId, SliceValue]
    table: RoundTable
    wan_codec: Codec | None  # the WAN compression the master set (None: dense)
    van: Van  # the server's transport (a route may send datagrams on its links, or count what it receives)
    upstream_addresses: dict[str, str]  # the tier above's servers: identity -> the address they listen on

    def send(self, peer: str, message: Message) -> None:
        """Send ``message`` to ``peer``."""

    def refuse(self, message: Message, text: str) -> None:
        """Answer ``message`` with an ERROR naming ``text`` (and log it)."""

    def display(self, client: str) -> str:
        """A node's name for logs and errors."""

    def release(self, rnd: Round, value: np.ndarray | None, error: str | None = None, number: int | None = None,
                body: dict[str, Any] | None = None, fields: dict[str, Any] | None = None) -> None:
        """Answer ``rnd``'s contributors (through the route) and open its next round."""

    def forward(self, rnd: Round, message: Message) -> None:
        """Send ``rnd``'s reduction up to the owner of its slice; release ``rnd`` with the answer."""

    def owner(self, key: int, index: int) -> str:
        """The server of the tier above that owns (key, slice)."""

    def tensor_info(self, key: int, index: int, kind: TensorKind, direction: Direction) -> TensorInfo:
        """What a codec is told about (key, slice) (its whole tensor's size included: size gates are per tensor)."""

    def call(self, peer: str, message: Message, then: Callable[[Future[Message]], None]) -> None:
        """Send a request to ``peer``; ``then(future)`` runs under the server lock once it is answered."""

    def push(self, message: Message) -> None:
        """Handle ``message`` as a push of a client (checked, then joins its round) (under the lock)."""

    def locked(self, action: Callable[[], None]) -> None:
        """Run ``action`` under the server lock (from a thread of the plug-in's own)."""


class Route(Capabilities):
    """How a value travels up and down. This base is the direct route: pushes go up as one request to the
    owner, and every contributor gets the round's answer in its reply. A route plug-in overrides hooks; one
    that carries values its own way says ``answers_plain_sums = False`` (geomx.core.capabilities)."""

    def start(self) -> None:
        """The server has joined the job (its peers and the tier above are known): start what the route runs."""

    def handlers(self) -> dict[MessageKind, Handler]:
        """Requests of these kinds go to the route before any client check (the route checks senders)."""
        return {}

    def holds(self, message: Message) -> bool:
        """A client's push (checked, decoded) that the route takes: True if it joins its round later, through
        ``PluginHost.push``, or was refused."""
        return False

    def outgoing(self, peer: str, message: Message) -> None:
        """``message`` is about to go to ``peer``: the route may add to its body."""

    def answer_arrived(self, reply: Message) -> None:
        """The tier above answered a push this server sent up (before it is decoded)."""

    def send_up(self, rnd: Round, fields: dict[str, Any]) -> bool:
        """A lower tier's reduction of ``rnd`` (message ``fields``): True if the route took it upward."""
        return False

    def send_down(self, rnd: Round, value: np.ndarray) -> bool:
        """``rnd``'s result: True if the route hands it to the contributors itself."""
        return False

    def accepts_without_tensor(self, message: Message) -> bool:
        """A push with no tensor that is still a contribution (its sum travels inside another's)."""
        return False

    def pushed(self, message: Message) -> None:
        """A push joined its round."""

    def answered_elsewhere(self, reply: Message) -> bool:
        """The tier above answered without the value: it comes by the route's own path."""
        return False

    def forget(self, client: str) -> None:
        """``client`` was dropped: it no longer takes part in the route (nor holds up a push)."""

    def close(self) -> None:
        """The server stops (without its lock): stop the threads the route runs."""

    def stop(self, run_dir: Path | None) -> None:
        """The server stops (under its lock): write the route's report, if it keeps one."""


class RouteChain(Route):
    """Several routes in one slot, asked in order: e.g. an overlay inside the party and another uplink to the
    tier above. A hook that takes something (True) stops at the first route that takes it."""

    def __init__(self, routes: list[Route]) -> None:
        self.routes = routes
        self.answers_plain_sums = all_answer_plain_sums(*routes)

    def start(self) -> None:
        for route in self.routes:
            route.start()

    def handlers(self) -> dict[MessageKind, Handler]:
        return {kind: handler for route in self.routes for kind, handler in route.handlers().items()}

    def holds(self, message: Message) -> bool:
        return any(route.holds(message) for route in self.routes)

    def outgoing(self, peer: str, message: Message) -> None:
        for route in self.routes:
            route.outgoing(peer, message)

    def answer_arrived(self, reply: Message) -> None:
        for route in self.routes:
            route.answer_arrived(reply)

    def send_up(self, rnd: Round, fields: dict[str, Any]) -> bool:
        return any(route.send_up(rnd, fields) for route in self.routes)

    def send_down(self, rnd: Round, value: np.ndarray) -> bool:
        return any(route.send_down(rnd, value) for route in self.routes)

    def accepts_without_tensor(self, message: Message) -> bool:
        return any(route.accepts_without_tensor(message) for route in self.routes)

    def pushed(self, message: Message) -> None:
        for route in self.routes:
            route.pushed(message)

    def answered_elsewhere(self, reply: Message) -> bool:
        return any(route.answered_elsewhere(reply) for route in self.routes)

    def forget(self, client: str) -> None:
        for route in self.routes:
            route.forget(client)

    def close(self) -> None:
        for route in self.routes:
            route.close()

    def stop(self, run_dir: Path | None) -> None:
        for route in self.routes:
            route.stop(run_dir)


@dataclass(frozen=True)
class Answer:
    """Answer the contributors with ``answer`` here; nothing goes up (a round inside the party)."""

    answer: np.ndarray


@dataclass(frozen=True)
class SendUp:
    """Send ``send`` up and answer with what the tier above answers (the plain sum, a model average's global
    rounds)."""

    send: np.ndarray


@dataclass(frozen=True)
class SendUpAndAnswer:
    """Send ``send`` up *and* answer with ``answer`` now; the tier above's answer arrives later, through
    ``Aggregation.adopted`` (an overlapped outer sync: the workers do not wait for the WAN)."""

    send: np.ndarray
    answer: np.ndarray


@dataclass(frozen=True)
class SendUpAndAwait:
    """Send ``send`` up and answer once the tier above answers, with what ``Aggregation.resumed`` makes of its
    answer (adopted first): a global round whose answer is mixed with the round's own sum."""

    send: np.ndarray


@dataclass(frozen=True)
class AwaitAnswer:
    """Answer once the tier above answers an earlier overlapped send of this slice (``Aggregation.resumed``
    then gives the answer)."""


# What a lower tier does with a completed round (``Aggregation.upward``): exactly one of these five cases,
# which the server takes apart with ``match`` (geomx.server.pushpull).
Upward = Answer | SendUp | SendUpAndAnswer | SendUpAndAwait | AwaitAnswer


class Aggregation(Capabilities):
    """What a tier does with a completed sum, and what it answers. This base is the plain sum: a lower tier
    sends its sum up as a gradient; the top tier's optimizer steps with it, or the sum itself is the answer."""

    push_kind = "gradient"  # what the upward sum is, for the WAN codec ("gradient" or "delta")
    answers_weights = False  # the top tier answers with weights even without an optimizer
    # every model slice takes part in every global round (a model average pushes frozen parameters too): a slice
    # without a completed round holds a checkpoint's step back (one whose turn to go global has not come yet)
    rounds_every_slice = False
    # (``answers_plain_sums``: the top tier's answer without an optimizer is the completed sum itself, adopted
    # as it is below; ``options``: geomx.core.capabilities.)

    @classmethod
    def from_config(cls, config: NodeConfig, host: PluginHost, **options: Any) -> Aggregation:
        """This aggregation for a server of ``config``, with its parsed ``options``."""
        return cls()

    @classmethod
    def check_options(cls, options: Mapping[str, Any], topology: Topology | None = None) -> None:
        """ValueError naming what is wrong with ``options`` (parsed) for a job of ``topology`` (if known)."""

    def round_rule(self) -> RoundRule | None:
        """A rule that closes this tier's rounds of pushes instead of the sync policy (decoupled rounds), if any."""
        return None

    def collected(self, rnd: Round) -> None:
        """A lower tier's round of pushes is complete, before ``upward``: what its contributions report (their
        bodies) is the aggregation's to read."""

    def up_body(self, sid: SliceId) -> dict[str, Any] | None:
        """Body keys of the push a lower tier sends up for (key, slice) (beside a codec's), if any."""
        return None

    def merge(self, rnd: Round) -> np.ndarray | None:
        """The top tier's merge of ``rnd``'s contributions (and late pushes folded in), where it is not the plain
        sum ``rnd.accum`` rescaled by the policy (None)."""
        return None

    def upward(self, sid: SliceId, total: np.ndarray) -> Upward:
        """What a lower tier does with a completed round's ``total`` (see ``Upward``)."""
        return SendUp(total)

    def resumed(self, sid: SliceId) -> np.ndarray:
        """The answer of the round ``upward`` told to wait, now that the tier above answered (``adopted``)."""
        raise NotImplementedError(f"{type(self).__name__} never waits")

    def gradient(self, total: np.ndarray) -> np.ndarray:
        """What the top tier's optimizer steps with."""
        return total

    def combine(self, value: np.ndarray, total: np.ndarray) -> np.ndarray:
        """The top tier's new value without an optimizer."""
        return total

    def answer_fields(self, rnd: Round, value: np.ndarray, previous: np.ndarray) -> dict[str, Any] | None:
        """The top tier's answer as message fields, if it is not the value itself (None)."""
        return None

    def answered(self, sid: SliceId, reply: Message) -> str | None:
        """A lower tier got the answer ``reply`` (decoded): make ``reply.tensor`` the value; an error text."""
        return None

    def adopted(self, sid: SliceId, value: np.ndarray) -> None:
        """A lower tier took ``value`` from the tier above as (key, slice)'s value (after INIT, a round, or an
        overlapped send's late answer)."""

    def may_drop(self, usual: bool) -> bool:
        """Whether this tier drops a dead client and goes on (``usual``: what the job and the policy say)."""
        return usual

    def held(self, sid: SliceId, value: np.ndarray) -> np.ndarray:
        """The job's model of (key, slice) as this lower tier holds it (``value``: what it stores, the
        tier above's last answer unless the tier answers rounds itself)."""
        return value

    def settled(self, sid: SliceId) -> bool:
        """Whether no overlapped send of (key, slice) is still waiting for the tier above's answer: a request
        for the job's model (``held``) waits until it is."""
        return True


class Extension:
    """An algorithm's own request kinds that become rounds (a speed report, say): how each request is checked
    (``requests``, after the server's client checks) and what a completed round of it does (``completions``)."""

    def requests(self) -> dict[MessageKind, Handler]:
        return {}

    def completions(self) -> dict[MessageKind, Completion]:
        return {}

    def holds_rejoiners(self) -> bool:
        """Whether a client that rejoins the job waits for the others' current cycle to end before its rounds
        count (its requests are held until then: ``Clients.add(hold=True)``)."""
        return False

    def rejoin_refusal(self, shards: int) -> str | None:
        """Why a client cannot rejoin a tier served by ``shards`` servers (None: it can)."""
        return None
