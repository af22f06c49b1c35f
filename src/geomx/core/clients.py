"""Who a server serves: its clients, those that left or were dropped, and those that rejoined and wait.

A server's rounds wait for its *awaited* clients: present ones that neither left, nor were dropped as dead,
nor joined after the round opened, nor are still *joining* (a rejoined client whose requests are held until
the others finish their current cycle, or the round of pushes under way: ``geomx.core.joiners``, so that it starts
in step with them).

A client is usually one connection (a local server, a flat worker). The ranks of a collective party (``lan:
collective``) are one client spread over several connections: each slice's push comes from the rank that owns
it, and the round counts the party once. ``group`` declares such a client; ``client_of`` names the client a
connection speaks for, and answers still go to the connection that asked.

Usage::

    clients = Clients({"a", "b"})
    clients.drop("b", "heartbeats stopped")
    clients.awaited(exempt=set())            # {"a"}
    clients.refusal("b")                     # "... was dropped from the job (heartbeats stopped) ..."
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator

from ..protocol.wire import Message


def collective_client(party: str) -> str:
    """The client name a collective party's ranks speak as, on a global server."""
    return f"{party}/ranks"


class Clients:
    """The membership of one server's rounds (the caller holds the server lock)."""

    def __init__(self, present: Iterable[str] = ()) -> None:
        self.present: set[str] = set(present)
        self.departed: set[str] = set()  # clients that left or were dropped (dead); rounds no longer wait for them
        self.dropped: dict[str, str] = {}  # departed clients that were dropped as dead -> why
        self.joining: dict[str, list[Message]] = {}  # rejoined clients -> their held requests
        self.groups: dict[str, str] = {}  # a collective party's rank (connection id) -> the client it speaks for
        self.parties: dict[str, str] = {}  # a grouped client -> its party
        self.owners: dict[tuple[str, tuple[int, int]], str] = {}  # (grouped client, slice) -> the rank that owns it

    def group(self, client: str, party: str, members: Iterable[str]) -> None:
        """``members`` (connection ids) speak for one client, ``client``, of party ``party``."""
        self.present.add(client)
        self.parties[client] = party
        for member in members:
            self.groups[member] = client

    def regroup(self, member: str, replaces: str) -> tuple[str, bool]:
        """A restarted collective rank ``member`` in place of the dead ``replaces``: it speaks for its party's
        client of this restart, a new name (the dead one stays departed, its rounds and owners with it), made by
        the first of the party's ranks to come back. Returns the client and whether this rank made it."""
        old = self.groups[replaces]
        party = self.parties[old]
        base = old.split("#")[0]
        current = max((c for c, p in self.parties.items() if p == party), key=self._generation)
        new = current in self.departed
        if new:
            current = f"{base}#{self._generation(current) + 1}"
            self.parties[current] = party
        self.groups[member] = current
        return current, new

    @staticmethod
    def _generation(client: str) -> int:
        return int(client.split("#")[1]) if "#" in client else 0

    def client_of(self, sender: str) -> str:
        """The client connection ``sender`` speaks for (itself, unless it is a rank of a collective party)."""
        return self.groups.get(sender, sender)

    def learn_owner(self, sender: str, sid: tuple[int, int]) -> None:
        """``sender`` declared slice ``sid`` (its INIT): a collective party's rank owns it."""
        client = self.groups.get(sender)
        if client is not None:
            self.owners[(client, sid)] = sender

    def address(self, client: str, sid: tuple[int, int]) -> str | None:
        """The connection that speaks for ``client`` about slice ``sid`` (None: not known yet)."""
        return self.owners.get((client, sid)) if client in self.parties else client

    def knows(self, sender: str) -> bool:
        """Whether connection ``sender`` belongs to a client of this server."""
        return self.client_of(sender) in self.present

    def __contains__(self, client: object) -> bool:
        return client in self.present

    def __iter__(self) -> Iterator[str]:
        return iter(self.present)

    def __len__(self) -> int:
        return len(self.present)

    def remaining(self) -> set[str]:
        """Clients that have not left nor been dropped."""
        return self.present - self.departed

    def awaited(self, exempt: set[str]) -> set[str]:
        """The clients a round waits for, given the ones ``exempt`` from it (joined after it opened)."""
        return self.present - self.departed - exempt - set(self.joining)

    def leave(self, client: str) -> bool:
        """``client`` shut down on its own; True if every client is now gone."""
        self.departed.add(client)
        return self.departed >= self.present

    def drop(self, client: str, why: str) -> set[str]:
        """``client`` is dead: rounds go on without it. Returns the clients that remain."""
        self.departed.add(client)
        self.dropped[client] = why
        self.joining.pop(client, None)
        return self.remaining()

    def add(self, client: str, *, hold: bool = False) -> None:
        """A (re)joining client; with ``hold``, its requests wait until ``admit`` (the others' next cycle)."""
        if hold:
            self.joining[client] = []
        self.present.add(client)

    def hold(self, message: Message) -> bool:
        """Keep ``message`` if its sender is still joining; True if it was kept."""
        held = self.joining.get(self.client_of(message.sender.decode()))
        if held is None:
            return False
        held.append(message)
        return True

    def only_joining_remain(self) -> bool:
        """Every remaining client is a held joiner: no cycle will end to admit them, so admit them now."""
        return bool(self.joining) and not self.remaining() - set(self.joining)

    def admit(self, only: Collection[str] | None = None) -> dict[str, list[Message]]:
        """End the hold of ``only`` (default: every joining client): the clients and the requests they sent
        meanwhile, to replay in order."""
        chosen = list(self.joining) if only is None else [client for client in only if client in self.joining]
        return {client: self.joining.pop(client) for client in chosen}

    def refusal(self, client: str, name: str) -> str | None:
        """Why a request of ``client`` (shown as ``name``) is refused as one of a departed client, if it is."""
        if client not in self.departed:
            return None
        why = self.dropped.get(client)
        return f"{name} has already shut down" if why is None else \
            f"{name} was dropped from the job ({why}); restart its party to rejoin"
