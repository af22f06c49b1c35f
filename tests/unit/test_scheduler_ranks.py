"""Rank assignment and expected members of the schedulers; WAN pipe sharing from the address book."""

from __future__ import annotations

import collections
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from geomx.cluster.membership import AddressBook, Member
from geomx.cluster.scheduler import _Registration, assign_ranks, expected_members
from geomx.config import Mode, NodeConfig, PartySpec, Role, Topology
from geomx.protocol.wire import Kind, Message


def reg(role: Role = Role.WORKER, party: str = "dc0", rank: int | None = None, master: bool = False) -> _Registration:
    return _Registration(Message(Kind.REGISTER), role, party, "tcp://127.0.0.1:1", rank, master)


def ranks_by_group(registrations, ranks):
    groups: dict[tuple, list[int]] = collections.defaultdict(list)
    for r, rank in zip(registrations, ranks, strict=True):
        groups[(r.role, r.party if r.role is not Role.GLOBAL_SERVER else "")].append(rank)
    return groups


# ---------------------------------------------------------------------------------------------------------
# assign_ranks


def test_ranks_fill_in_arrival_order_without_requests():
    regs = [reg() for _ in range(4)]
    assert assign_ranks(regs) == [0, 1, 2, 3]


def test_master_gets_zero():
    regs = [reg(), reg(), reg(master=True), reg()]
    ranks = assign_ranks(regs)
    assert ranks[2] == 0
    assert sorted(ranks) == [0, 1, 2, 3]


def test_master_gets_zero_even_if_it_asked_for_another_rank():
    regs = [reg(), reg(rank=3, master=True), reg(), reg()]
    ranks = assign_ranks(regs)
    assert ranks[1] == 0 and sorted(ranks) == [0, 1, 2, 3]


def test_requested_ranks_are_honored_and_gaps_filled():
    regs = [reg(), reg(rank=3), reg(), reg(rank=1), reg()]
    ranks = assign_ranks(regs)
    assert ranks[1] == 3 and ranks[3] == 1
    assert [ranks[0], ranks[2], ranks[4]] == [0, 2, 4]  # the free ranks, in arrival order


def test_duplicate_or_out_of_range_requests_fall_back_to_free_ranks():
    regs = [reg(rank=1), reg(rank=1), reg(rank=7), reg(rank=-1)]
    ranks = assign_ranks(regs)
    assert ranks[0] == 1  # first come keeps it
    assert sorted(ranks) == [0, 1, 2, 3]
    assert ranks[1] != 1


def test_ranks_are_per_role_and_party():
    regs = [reg(Role.WORKER, "dc0"), reg(Role.WORKER, "dc1"), reg(Role.WORKER, "dc0"), reg(Role.WORKER, "dc1"),
            reg(Role.LOCAL_SERVER, "dc0"), reg(Role.LOCAL_SERVER, "dc1")]
    assert assign_ranks(regs) == [0, 0, 1, 1, 0, 0]


def test_local_servers_are_always_rank_zero():
    regs = [reg(Role.LOCAL_SERVER, "dc0", rank=2), reg(Role.LOCAL_SERVER, "dc1", rank=5)]
    assert assign_ranks(regs) == [0, 0]


def test_global_servers_share_one_rank_space_across_parties():
    regs = [reg(Role.GLOBAL_SERVER, "dc0", rank=1), reg(Role.GLOBAL_SERVER, "dc0"), reg(Role.GLOBAL_SERVER, "dc0"),
            reg(Role.LOCAL_SERVER, "dc0"), reg(Role.LOCAL_SERVER, "dc1")]
    ranks = assign_ranks(regs)
    assert ranks[:3] == [1, 0, 2]  # shard ids requested first, the rest fill the gaps
    assert ranks[3:] == [0, 0]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([Role.WORKER, Role.GLOBAL_SERVER, Role.LOCAL_SERVER]),
                          st.sampled_from(["dc0", "dc1"]), st.none() | st.integers(-2, 6)),
                min_size=1, max_size=12),
       st.data())
def test_ranks_are_a_permutation_per_group(specs, data):
    regs = [reg(role, party, rank) for role, party, rank in specs]
    workers = [i for i, r in enumerate(regs) if r.role is Role.WORKER and r.party == "dc0"]
    if workers:  # at most one master per party
        regs[data.draw(st.sampled_from(workers))] = reg(Role.WORKER, "dc0", None, master=True)
    ranks = assign_ranks(regs)
    for group in ranks_by_group(regs, ranks).values():
        assert sorted(group) == list(range(len(group)))  # ranks 0..n-1 within each (role, party)
    # the master is at 0 unless another worker of its party asked for 0 (that conflict is the order-dependence
    # bug pinned by test_master_gets_zero_whatever_the_arrival_order)
    contested = any(r.requested_rank == 0 and not r.master for r in regs if r.role is Role.WORKER and r.party == "dc0")
    for r, rank in zip(regs, ranks, strict=True):
        if r.master and not contested:
            assert rank == 0


def test_master_gets_zero_whatever_the_arrival_order():
    for order in itertools.permutations([reg(rank=0), reg(master=True), reg()]):
        ranks = assign_ranks(list(order))
        master_rank = next(rank for r, rank in zip(order, ranks, strict=True) if r.master)
        assert master_rank == 0


# ---------------------------------------------------------------------------------------------------------
# expected_members


def topology(mode: Mode, num_global_servers: int = 2) -> Topology:
    return Topology(parties=(PartySpec("dc0", 2), PartySpec("dc1", 3)), central="dc0",
                    num_global_servers=num_global_servers, mode=mode)


def config(role: Role, party: str, mode: Mode, num_global_servers: int = 2) -> NodeConfig:
    return NodeConfig(role=role, party=party, topology=topology(mode, num_global_servers),
                      global_scheduler="127.0.0.1:9000", scheduler="127.0.0.1:9001")


def test_expected_members_hips_global():
    expected = expected_members(config(Role.GLOBAL_SCHEDULER, "dc0", Mode.HIPS))
    assert expected == collections.Counter({(Role.GLOBAL_SERVER, "dc0"): 2, (Role.LOCAL_SERVER, "dc0"): 1,
                                            (Role.LOCAL_SERVER, "dc1"): 1})


def test_expected_members_flat_global():
    expected = expected_members(config(Role.GLOBAL_SCHEDULER, "dc0", Mode.FLAT, num_global_servers=1))
    assert expected == collections.Counter({(Role.GLOBAL_SERVER, "dc0"): 1, (Role.WORKER, "dc0"): 2,
                                            (Role.WORKER, "dc1"): 3})
    assert not any(role is Role.LOCAL_SERVER for role, _ in expected)


@pytest.mark.parametrize("party,workers", [("dc0", 2), ("dc1", 3)])
def test_expected_members_local(party, workers):
    expected = expected_members(config(Role.LOCAL_SCHEDULER, party, Mode.HIPS))
    assert expected == collections.Counter({(Role.LOCAL_SERVER, party): 1, (Role.WORKER, party): workers})


# ---------------------------------------------------------------------------------------------------------
# AddressBook.wan_share


def member(role: Role, party: str, rank: int = 0) -> Member:
    return Member(f"{party}/{role.value}/{rank}", role, party, rank, f"tcp://127.0.0.1:{1000 + rank}")


def hips_global_book(num_global_servers: int) -> AddressBook:
    return AddressBook(tuple(
        [member(Role.GLOBAL_SERVER, "dc0", r) for r in range(num_global_servers)]
        + [member(Role.LOCAL_SERVER, p) for p in ("dc0", "dc1", "dc2")]))


@pytest.mark.parametrize("num_global_servers", [1, 2, 3])
def test_wan_share_hips(num_global_servers):
    book = hips_global_book(num_global_servers)
    # a remote party's local server is the only one of its party on the WAN
    assert book.wan_share("dc1", "dc0") == 1
    assert book.wan_share("dc2", "dc0") == 1
    # the central party's global servers all send to each remote local server over one pipe
    assert book.wan_share("dc0", "dc1") == num_global_servers
    assert book.wan_share("dc0", "dc2") == num_global_servers


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_wan_share_flat(workers):
    book = AddressBook(tuple(
        [member(Role.GLOBAL_SERVER, "dc0", 0)]
        + [member(Role.WORKER, "dc0", r) for r in range(2)]
        + [member(Role.WORKER, "dc1", r) for r in range(workers)]))
    # every worker of a party talks to the global servers: they share the party's pipe
    assert book.wan_share("dc1", "dc0") == workers
    assert book.wan_share("dc0", "dc1") == 1  # the one global server


def test_wan_share_ignores_schedulers_and_is_at_least_one():
    book = AddressBook((member(Role.GLOBAL_SCHEDULER, "dc0"), member(Role.LOCAL_SCHEDULER, "dc1"),
                        member(Role.LOCAL_SERVER, "dc1"), member(Role.GLOBAL_SERVER, "dc0")))
    assert book.wan_share("dc1", "dc0") == 1
    assert book.wan_share("dc1", "dc9") == 1  # nobody there: still a valid share
    assert AddressBook(()).wan_share("a", "b") == 1


def test_member_names_and_json():
    assert member(Role.WORKER, "dc1", 2).name == "dc1/worker2"
    assert member(Role.LOCAL_SERVER, "dc1").name == "dc1/server"
    assert member(Role.GLOBAL_SERVER, "dc0", 1).name == "global_server1"
    m = member(Role.WORKER, "dc1", 2)
    assert Member.from_json(m.to_json()) == m
    book = hips_global_book(2)
    assert [x.rank for x in book.of_role(Role.GLOBAL_SERVER)] == [0, 1]
    assert [x.party for x in book.of_role(Role.LOCAL_SERVER)] == ["dc0", "dc1", "dc2"]
    assert book.get("dc1/local_server/0").party == "dc1"
    with pytest.raises(KeyError):
        book.get("nobody")


def test_sync_policies():
    from geomx.algorithms.registry import SYNC_POLICIES, sync_policy

    assert set(SYNC_POLICIES) == {"dist_sync", "dist_async", "dist_ssp"}
    fsa, mixed = sync_policy("dist_sync"), sync_policy("dist_async")
    assert not fsa.round_complete({"a"}, {"a", "b"})
    assert fsa.round_complete({"a", "b"}, {"a", "b"})
    assert mixed.round_complete({"a"}, {"a", "b"})
    assert not mixed.round_complete(set(), {"a", "b"})
    with pytest.raises(ValueError, match="valid: \\['dist_async', 'dist_ssp', 'dist_sync'\\]"):
        sync_policy("dist_bogus")
