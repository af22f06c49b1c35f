"""ESync's state rounds in the servers: the workers' speed reports merge up the tree, the global server (shard 0)
assigns each worker its local steps (``geomx.policies.esync.assign_steps``), and everyone gets the assignment.

A STATE request is validated, then joins a round like any other; a local server sends its party's merged
report up as one request, and the global server's answer is the assignment. The end of a state round is the
end of a cycle: clients that rejoined meanwhile take part from the next one.

Usage (the composition root)::

    extension = state_rounds_from_config(node_config, server)
    handlers.update(extension.requests()); completions.update(extension.completions())
"""

from __future__ import annotations

from concurrent.futures import Future

from ..config import NodeConfig, Role
from ..core.plugins import Completion, Extension, Handler, ServerHost
from ..core.rounds import Round
from ..policies.esync import assign_steps
from ..wire import Kind, Message


class StateRounds(Extension):
    """STATE requests and rounds of one server."""

    def __init__(self, host: ServerHost, is_top: bool) -> None:
        self.host = host
        self.is_top = is_top  # this server assigns (a global server) rather than forwarding up

    def requests(self) -> dict[Kind, Handler]:
        return {Kind.STATE: self.on_state}

    def completions(self) -> dict[Kind, Completion]:
        return {Kind.STATE: self.complete}

    def on_state(self, message: Message) -> None:
        """A speed report: {"seconds_per_step": {worker: s}, "base_steps": n}; validated, then a round."""
        body = message.body or {}
        speeds = body.get("seconds_per_step")
        base = body.get("base_steps")
        if (not isinstance(speeds, dict) or not speeds or not isinstance(base, int) or isinstance(base, bool)
                or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in speeds.values())):
            self.host.refuse(message, "STATE needs {'seconds_per_step': {worker: seconds}, 'base_steps': int}")
            return
        self.host.table.contribute(message)

    def complete(self, rnd: Round) -> None:
        """Merge the reports; the global server (shard 0) assigns local steps, everyone gets the assignment."""
        speeds: dict[str, float] = {}
        base = 1
        for message in rnd.contributions.values():
            body = message.body or {}
            speeds.update(body["seconds_per_step"])
            base = max(base, int(body["base_steps"]))
        if self.is_top:
            try:
                steps = assign_steps(speeds, base)
            except ValueError as exc:
                self.host.release(rnd, None, str(exc))
                return
            self.host.release(rnd, None, body={"steps": steps})
            self.host.table.admit()
            return
        number = rnd.number
        self.host.call(self.host.upstream[0], Message(Kind.STATE, round=rnd.number, body={
            "seconds_per_step": speeds, "base_steps": base}), lambda f: self._finish(rnd, f, number))

    def _finish(self, rnd: Round, future: Future[Message], number: int) -> None:
        error = future.exception()
        if error is not None:
            self.host.release(rnd, None, str(error), number)
        else:
            self.host.release(rnd, None, None, number, body=future.result().body)


def state_rounds_from_config(config: NodeConfig, host: ServerHost) -> StateRounds:
    """A server's state rounds: a global server assigns the steps, a local server forwards its party's reports."""
    return StateRounds(host, is_top=config.role is Role.GLOBAL_SERVER)
