"""A server's clients (``geomx.core.clients``): a collective party's ranks speak as one client, and a restarted
party's ranks as a new one once the old one was dropped."""

from __future__ import annotations

from geomx.core.clients import Clients, collective_client


def test_a_restarted_collective_partys_ranks_speak_as_one_new_client() -> None:
    clients = Clients({"dc0/server"})
    client = collective_client("dc1")
    clients.group(client, "dc1", ["r0", "r1"])
    clients.learn_owner("r1", (0, 0))
    assert clients.client_of("r1") == client and clients.address(client, (0, 0)) == "r1"
    clients.drop(client, "rank 1 died")
    assert clients.awaited(exempt=set()) == {"dc0/server"}
    first, made = clients.regroup("n1", replaces="r1")  # the first rank back makes the party's new client
    assert made and first != client and first.startswith(client)
    clients.add(first)
    second, made = clients.regroup("n0", replaces="r0")
    assert second == first and not made
    assert clients.awaited(exempt=set()) == {"dc0/server", first}  # the old client stays dropped
    assert clients.address(first, (0, 0)) is None  # its owners are learnt again from its INITs
    clients.learn_owner("n0", (0, 0))
    assert clients.address(first, (0, 0)) == "n0"
    clients.drop(first, "died again")
    third, made = clients.regroup("m0", replaces="n0")
    assert made and third not in (client, first)
