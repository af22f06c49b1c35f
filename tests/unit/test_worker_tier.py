"""The collective rank beneath the kvstore (``geomx.worker.tier``), and the typed seam through which a strategy
reaches its party's ranks (``geomx.core.ranks``): the kvstore delegates to its tier without asking which it holds;
the seam's members are the implementations' own; no algorithm climbs through the kvstore to the ranks."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from geomx.core import ranks as seam
from geomx.kv import KVStore
from geomx.worker.ranks import PartyRanks
from geomx.worker.tier import CollectiveTier, LanTier

SRC = Path(__file__).resolve().parents[2] / "src" / "geomx"


class Group:
    """A party's group that records its barriers, in order with the calls around them."""

    def __init__(self, rank: int, log: list[str]) -> None:
        self.rank, self.log, self.party = rank, log, "dc1"

    def barrier(self) -> None:
        self.log.append("barrier")

    def close(self) -> None:
        self.log.append("close")


def _tier(rank: int) -> tuple[CollectiveTier, list[str]]:
    log: list[str] = []
    ranks = SimpleNamespace(group=Group(rank, log), rank=rank,
                            first_rank_says=lambda ask, what: log.append(f"first rank: {what}") or ask())
    return CollectiveTier(ranks), log  # type: ignore[arg-type]


@pytest.mark.parametrize("rank", [0, 1])
def test_a_collective_party_meets_inside_first_and_its_rank_0_speaks_for_it(rank: int) -> None:
    tier, log = _tier(rank)
    tier.barrier(lambda: log.append("meet"))
    assert log == (["barrier", "meet", "barrier"] if rank == 0 else ["barrier", "barrier"])
    log.clear()
    assert tier.leaving() is (rank == 0) and log == ["barrier"]
    assert tier.for_party(lambda: 3, "the steps") == 3 and log[-1] == "first rank: the steps"
    tier.close()
    assert log[-1] == "close"
    with pytest.raises(RuntimeError, match=r"kv\.push in a lan: collective party"):
        tier.refuse_per_key_api("push")


def test_a_party_with_a_local_server_has_nothing_beneath_the_kvstore() -> None:
    tier, log = LanTier(), []
    tier.barrier(lambda: log.append("meet"))
    tier.refuse_per_key_api("push")
    assert log == ["meet"] and tier.leaving() and tier.for_party(lambda: 5, "the steps") == 5
    assert tier.ranks is None and not tier.init([0], [])


def test_the_kvstore_delegates_to_its_tier() -> None:
    tier, log = _tier(1)
    kv = SimpleNamespace(_tier=tier)
    assert KVStore.ranks.fget(kv) is tier.ranks  # type: ignore[attr-defined]
    with pytest.raises(RuntimeError, match=r"kv\.pull in a lan: collective party"):
        KVStore.pull(kv, 0, None)  # type: ignore[arg-type]
    KVStore.barrier(kv)  # type: ignore[arg-type]
    assert log == ["barrier", "barrier"]  # rank 1: the party's barrier only, no request of its own


def _members(protocol: type) -> list[str]:
    own = [name for name in vars(protocol) if not name.startswith("_")]
    return sorted({*own, *getattr(protocol, "__annotations__", {})})


@pytest.mark.parametrize(("protocol", "implementation"), [(seam.PartyRanks, PartyRanks), (seam.Store, KVStore)])
def test_the_seam_names_what_the_implementations_offer(protocol: type, implementation: type) -> None:
    """Every member of the seam is the implementation's, with the same parameters (attributes set in ``__init__``
    are looked for there)."""
    init = inspect.getsource(implementation.__init__)
    for name in _members(protocol):
        declared = getattr(protocol, name, None)
        if callable(declared):
            got = getattr(implementation, name)
            assert list(inspect.signature(got).parameters) == list(inspect.signature(declared).parameters), name
        else:
            assert hasattr(implementation, name) or re.search(rf"self\.{name}\b\s*[:=]", init), name


def test_no_algorithm_reaches_the_ranks_through_the_kvstore() -> None:
    """Strategies reach their party's ranks as ``loop.ranks`` (``geomx.core.ranks.PartyRanks``), never ``kv.ranks``;
    the kvstore keeps its collective party beneath it, in its tier."""
    climbs = [f"{path.relative_to(SRC)}:{number}" for path in sorted((SRC / "algorithms").rglob("*.py"))
              for number, line in enumerate(path.read_text().splitlines(), 1) if "kv.ranks" in line]
    assert climbs == []
    tree = ast.parse((SRC / "kv.py").read_text())
    uses = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr == "ranks"]
    assert len(uses) <= 4, uses
