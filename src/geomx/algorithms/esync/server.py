"""ESync's state rounds in the servers: the workers' speed reports merge up the tree, the global server (shard 0)
assigns each worker its local steps (``geomx.algorithms.esync.rules.assign_steps``), and everyone gets the assignment.

A STATE request is validated, then joins a round like any other; a local server sends its party's merged
report up as one request, and the global server's answer is the assignment. The end of a state round is the
end of a cycle: clients that rejoined meanwhile take part from the next one.

Usage (the composition root)::

    extension = state_rounds_from_config(node_config, server)
    handlers.update(extension.requests()); completions.update(extension.completions())
"""

from __future__ import annotations

from concurrent.futures import Future

from ...config import NodeConfig, Role
from ...core.plugins import Completion, Extension, Handler, PluginHost
from ...core.rounds import Round
from ...protocol.bodies import BodyError, decode_body, encode_body
from ...protocol.wire import Message, MessageKind
from .bodies import StateReport, StepAssignment
from .kinds import STATE
from .rules import assign_steps


class StateRounds(Extension):
    """STATE requests and rounds of one server."""

    def __init__(self, host: PluginHost, is_top: bool) -> None:
        self.host = host
        self.is_top = is_top  # this server assigns (a global server) rather than forwarding up

    def requests(self) -> dict[MessageKind, Handler]:
        return {STATE: self.on_state}

    def completions(self) -> dict[MessageKind, Completion]:
        return {STATE: self.complete}

    def holds_rejoiners(self) -> bool:
        """A rejoined client joins at the others' next cycle (the end of a state round), so that its first push
        meets their first push of that cycle. Only where state rounds run (shard 0 sees them)."""
        return self.host.table.has_kind(STATE)

    def rejoin_refusal(self, shards: int) -> str | None:
        if self.holds_rejoiners() and shards > 1:
            # The hold that aligns a rejoiner with the others' next cycle exists on shard 0 only: the other
            # global servers' per-key rounds would take its pushes a cycle apart and deadlock.
            return ("ESync with several global servers cannot take a party back (only global server 0 sees the "
                    "state rounds that align it); restart the whole job with --resume")
        return None

    def on_state(self, message: Message) -> None:
        """A speed report: {"seconds_per_step": {worker: s}, "base_steps": n}; validated, then a round."""
        try:
            report = decode_body(StateReport, message.body)
        except BodyError:
            report = None
        if report is None or not report.seconds_per_step:
            self.host.refuse(message, "STATE needs {'seconds_per_step': {worker: seconds}, 'base_steps': int}")
            return
        self.host.table.contribute(message)

    def complete(self, rnd: Round) -> None:
        """Merge the reports; the global server (shard 0) assigns local steps, everyone gets the assignment."""
        speeds: dict[str, float] = {}
        base = 1
        for message in rnd.contributions.values():
            report = decode_body(StateReport, message.body)  # checked when it arrived (on_state)
            speeds.update(report.seconds_per_step)
            base = max(base, report.base_steps)
        if self.is_top:
            try:
                steps = assign_steps(speeds, base)
            except ValueError as exc:
                self.host.release(rnd, None, str(exc))
                return
            self.host.release(rnd, None, body=encode_body(StepAssignment(steps=steps)))
            self.host.table.admit()
            return
        number = rnd.number
        merged = encode_body(StateReport(seconds_per_step=speeds, base_steps=base))
        self.host.call(self.host.upstream[0], Message(STATE, round=rnd.number, body=merged),
                       lambda f: self._finish(rnd, f, number))

    def _finish(self, rnd: Round, future: Future[Message], number: int) -> None:
        error = future.exception()
        if error is not None:
            self.host.release(rnd, None, str(error), number)
        else:
            self.host.release(rnd, None, None, number, body=future.result().body)


def state_rounds_from_config(config: NodeConfig, host: PluginHost) -> StateRounds:
    """A server's state rounds: a global server assigns the steps, a local server forwards its party's reports."""
    return StateRounds(host, is_top=config.role is Role.GLOBAL_SERVER)
