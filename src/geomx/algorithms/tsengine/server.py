"""TSEngine as a server's route: pushes pre-merge in pairs while the link above is busy, and each round's result
travels down an overlay of relays instead of a star (see ``rules.py`` for the overlays themselves).

A *coordinator* (a global server for its local servers under ENABLE_INTER_TS; a local server for its workers
under ENABLE_INTRA_TS) answers its clients' asks (where should a held sum go?) and hands each round's result
to one client at a time while holders relay it on. A *member* (a local server under ENABLE_INTER_TS) holds
its party's sum until its coordinator says where to send it, merges a fellow local server's sum into it,
takes the round's value from whoever relays it and passes its copy on when told. A server may be both.

Usage (the composition root)::

    route = tsengine_from_config(node_config, server)
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from ...config import NodeConfig, Role
from ...core.plugins import Handler, PluginHost, Route
from ...core.rounds import Round, SliceValue
from ...protocol.wire import Kind, Message, MessageKind, SliceId
from .kinds import RELAY
from .rules import Coordinator, Dissemination, PushPairing, write_report

log = logging.getLogger("geomx.server")


class TsEngineRoute(Route):
    """TSEngine's coordinator and/or member side of one server."""

    answers_plain_sums = False  # values travel along the overlays, not in each contributor's reply

    def __init__(self, host: PluginHost, coordinator: Coordinator | None, member: bool) -> None:
        self.host = host
        self.ts = coordinator
        self.member = member
        self.rounds: dict[SliceId, Dissemination] = {}
        self.values: dict[SliceId, tuple[np.ndarray, int]] = {}  # value, num_slices
        self.pairings: dict[SliceId, PushPairing] = {}  # a coordinator's aggregation overlays
        self.asks: dict[tuple[SliceId, str], Message] = {}  # each client's last ask per slice
        self.pending: dict[SliceId, tuple[Round, np.ndarray]] = {}  # a member's held sums

    # -- the core's hooks ---------------------------------------------------------------------------------
    def handlers(self) -> dict[MessageKind, Handler]:
        return {RELAY: self.on_relay}

    def send_up(self, rnd: Round, fields: dict[str, Any]) -> bool:
        """A member holds its party's sum and asks the owning global server where it should go."""
        if not self.member or "tensor" not in fields:
            return False
        sid = (rnd.key, rnd.slice)
        first = next(iter(rnd.contributions.values()))
        self.pending[sid] = (rnd, np.array(fields["tensor"], dtype=np.float32))
        self.host.send(self.host.owner(*sid), Message(RELAY, key=rnd.key, slice=rnd.slice, round=rnd.number,
                                                      num_slices=first.num_slices, body={"ask": True}))
        return True

    def send_down(self, rnd: Round, value: np.ndarray) -> bool:
        """A coordinator answers every client at once without the value, then hands it on through the overlay."""
        if self.ts is None or rnd.kind is not Kind.PUSHPULL:
            return False
        sid = (rnd.key, rnd.slice)
        targets = {sender: message.round for sender, message in rnd.contributions.items()}
        self.values[sid] = (value, next(iter(rnd.contributions.values())).num_slices)
        self.rounds[sid] = self.ts.start(self.host.identity, targets, value.nbytes)
        self.host.table.release(rnd, None, body={"ts": "relayed"})
        self._serve(sid, self.host.identity)
        return True

    def accepts_without_tensor(self, message: Message) -> bool:
        """This party's sum travels inside another party's push."""
        return self.ts is not None and "ts_merged" in (message.body or {})

    def pushed(self, message: Message) -> None:
        """The link is free: the next waiting client may push."""
        if self.ts is not None:
            sid = (message.key, message.slice)
            self._instruct(sid, self.ts.pushed(self.pairings.setdefault(sid, PushPairing())))

    def answered_elsewhere(self, reply: Message) -> bool:
        """The value comes as a RELAY from the global server or a fellow local server."""
        return (reply.body or {}).get("ts") == "relayed"

    def forget(self, client: str) -> None:
        """A dropped client no longer receives, relays or holds up a push."""
        if self.ts is None:
            return
        for sid, pairing in self.pairings.items():
            self._instruct(sid, self.ts.forget_pusher(pairing, client))
        for sid, dissemination in list(self.rounds.items()):
            for holder in self.ts.forget_target(dissemination, client):
                self._serve(sid, holder)
            self._end_if_done(sid, dissemination)

    def stop(self, run_dir: Path | None) -> None:
        if self.ts is not None and run_dir is not None:
            write_report(run_dir, self.host.name, self.ts.report())

    # -- RELAY messages -----------------------------------------------------------------------------------
    def on_relay(self, message: Message) -> None:
        """An ask or an ack from a client (coordinator), or, on a member, a value to take, an instruction to
        pass ours on or to push our sum, or a fellow's sum to merge."""
        host = self.host
        sender = message.sender.decode()
        if self.ts is not None and sender in host.clients:
            self._coordinate(message, sender)
            return
        if not self.member:
            on = "on" if self.ts is not None else "off"
            host.refuse(message, f"RELAY from {host.display(sender)}: TSEngine here coordinates only this "
                                 f"server's own clients (it is {on}), and relays from other servers need "
                                 "ENABLE_INTER_TS on a local server")
            return
        sid = (message.key, message.slice)
        body = message.body or {}
        if "push" in body or "merge" in body:
            self._push(message, sender)
            return
        if "to" in body:  # pass our copy on
            target, stored = body["to"], host.stored.get(sid)
            if sender not in host.upstream or target not in host.peers or stored is None:
                host.refuse(message, f"cannot relay key {message.key} slice {message.slice} to {target!r}")
                return
            host.send(target, Message(RELAY, key=message.key, slice=message.slice, round=message.round,
                                      num_slices=message.num_slices, tensor=stored.value))
            return
        rnd = host.table.get(Kind.PUSHPULL, *sid)
        if (sender not in host.upstream and sender not in host.peers) or message.tensor is None:
            host.refuse(message, "RELAY data must come from a global server or a fellow local server")
            return
        if rnd is None or not rnd.forwarding or rnd.number != message.round:
            log.warning("[%s] RELAY of key %d slice %d round %d matches no waiting round", host.name, *sid,
                        message.round)
            return
        host.stored[sid] = SliceValue(message.tensor)
        host.release(rnd, message.tensor, None, message.round)
        host.send(host.owner(*sid), Message(RELAY, key=message.key, slice=message.slice,
                                            num_slices=message.num_slices, round=message.round, body={"ack": True}))

    def _coordinate(self, message: Message, sender: str) -> None:
        """A client's ask (it holds a sum: where should it go?) or ack (it has the round's value)."""
        assert self.ts is not None
        sid = (message.key, message.slice)
        body = message.body or {}
        if body == {"ask": True}:
            self.asks[(sid, sender)] = message
            self._instruct(sid, self.ts.ask_push(self.pairings.setdefault(sid, PushPairing()), sender))
            return
        if body != {"ack": True}:
            self.host.refuse(message, "a TSEngine coordinator takes only RELAY asks and acks from its clients")
            return
        dissemination = self.rounds.get(sid)
        holder = None if dissemination is None else self.ts.acknowledged(dissemination, sender)
        if dissemination is None or holder is None:
            log.warning("[%s] stray RELAY ack for key %d slice %d", self.host.name, *sid)
            return
        self._serve(sid, holder)
        self._serve(sid, sender)
        self._end_if_done(sid, dissemination)

    def _push(self, message: Message, sender: str) -> None:
        """A member: send the held sum as told, or add a fellow local server's sum to it and ask again."""
        host = self.host
        sid = (message.key, message.slice)
        body = message.body or {}
        pending = self.pending.get(sid)
        if pending is None or pending[0].number != message.round or not pending[0].forwarding:
            log.error("[%s] TSEngine %s for key %d slice %d round %d, but no sum of that round is held",
                      host.name, sorted(body), message.key, message.slice, message.round)
            return
        rnd, total = pending
        if "merge" in body:
            if sender not in host.peers or message.tensor is None or message.tensor.size != total.size:
                host.refuse(message, "a TSEngine merge needs a fellow local server's sum of the same slice")
                return
            np.add(total, message.tensor.reshape(total.shape), out=total)
            host.send(host.owner(*sid), Message(RELAY, key=rnd.key, slice=rnd.slice, round=rnd.number,
                                                num_slices=message.num_slices, body={"ask": True}))
            return
        if sender not in host.upstream:
            host.refuse(message, "only the global server directs TSEngine pushes")
            return
        del self.pending[sid]
        push = Message(Kind.PUSHPULL, key=rnd.key, slice=rnd.slice, num_slices=message.num_slices, round=rnd.number)
        target = body.get("to")
        if body.get("push") == "peer" and isinstance(target, str) and target in host.peers:
            host.send(target, Message(RELAY, key=rnd.key, slice=rnd.slice, round=rnd.number,
                                      num_slices=message.num_slices, tensor=total, body={"merge": True}))
            push.body = {"ts_merged": target}
        else:
            push.tensor = total.astype(host.stored[sid].value.dtype, copy=False)
        host.forward(rnd, push)

    # -- the overlays -------------------------------------------------------------------------------------
    def _serve(self, sid: SliceId, holder: str) -> None:
        """Let ``holder`` (this server or a client that has the value) send to the next target."""
        assert self.ts is not None
        dissemination = self.rounds.get(sid)
        if dissemination is None:
            return
        target = self.ts.next_target(dissemination, holder)
        if target is None:
            return
        value, num_slices = self.values[sid]
        message = Message(RELAY, key=sid[0], slice=sid[1], num_slices=num_slices,
                          round=dissemination.targets[target])
        if holder == self.host.identity:
            message.tensor = value
            self.host.send(target, message)
        else:
            message.body = {"to": target}
            self.host.send(holder, message)

    def _instruct(self, sid: SliceId, orders: list[tuple[str, str | None]]) -> None:
        """Tell each client in ``orders`` where to send its held sum (None: to this server), naming the round
        of its own last ask."""
        for node, target in orders:
            ask = self.asks[(sid, node)]
            body: dict[str, Any] = {"push": "server"} if target is None else {"push": "peer", "to": target}
            self.host.send(node, Message(RELAY, key=sid[0], slice=sid[1], num_slices=ask.num_slices,
                                         round=ask.round, body=body))

    def _end_if_done(self, sid: SliceId, dissemination: Dissemination) -> None:
        """Every client has the round's value: the coordinator lets go of it."""
        if dissemination.done:
            self.rounds.pop(sid, None)
            self.values.pop(sid, None)



def tsengine_from_config(config: NodeConfig, host: PluginHost) -> TsEngineRoute:
    """A server's TSEngine route: a coordinator of its own clients (a global server under ENABLE_INTER_TS, a
    local server under ENABLE_INTRA_TS) and/or a relaying member (a local server under ENABLE_INTER_TS)."""
    topology = config.topology
    spec = topology.tsengine
    assert spec is not None
    is_global = config.role is Role.GLOBAL_SERVER
    return tsengine_route(host, spec.max_greed, spec.seed, coordinates=topology.inter_ts if is_global else
                          topology.intra_ts, member=topology.inter_ts and not is_global)


def tsengine_route(host: PluginHost, max_greed: float, seed: int, coordinates: bool, member: bool) -> TsEngineRoute:
    """The route of a server under TSEngine: a coordinator of its own clients and/or a relaying member."""
    return TsEngineRoute(host, Coordinator(max_greed, seed) if coordinates else None, member)
