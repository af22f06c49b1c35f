"""The kvstore's LAN tier: what a worker does differently as a rank of a ``lan: collective`` party, beneath the
kvstore rather than beside it.

``LanTier`` is a worker whose party has a local server (or a flat job's worker): the kvstore talks to its servers
alone, and every call here does nothing or just what it is asked. ``CollectiveTier`` is a rank of a collective
party (``geomx.worker.ranks.PartyRanks``): it takes its early sums, INITs the slices it owns, refuses the per-key
API, meets the party's ranks first at a barrier, and lets rank 0 speak for the party. ``geomx.kv.KVStore`` holds
one and calls it without asking which it holds.

Usage (inside ``KVStore``)::

    tier = lan_tier(node_config, rank, sender)       # a CollectiveTier in a lan: collective party
    if tier.handles(message): return                  # an early sum of a slice this rank owns
    tier.barrier(lambda: ...)                         # the job's barrier, met inside the party first
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..config import NodeConfig
from ..core.early import EarlyAnswers
from ..protocol.wire import Message
from .ranks import PartyRanks
from .sender import SliceSender


class LanTier:
    """A worker whose party has a local server, or a flat job's: nothing beneath the kvstore."""

    ranks: PartyRanks | None = None

    def handles(self, message: Message) -> bool:
        """Whether ``message`` was this tier's to take (the kvstore's own handling skipped)."""
        return False

    def init(self, keys: list[int], values: list[torch.Tensor]) -> bool:
        """Whether this tier INITed ``keys`` (else the kvstore INITs every slice itself)."""
        return False

    def refuse_per_key_api(self, what: str) -> None:
        """Raise if the kvstore API's per-key call ``what`` (push, pull, pushpull) is not this tier's."""

    def for_party(self, ask: Callable[[], int], what: str) -> int:
        """``ask()``: a number this worker asks the servers for, the party's own (a collective party's rank 0 asks
        for all its ranks)."""
        return ask()

    def barrier(self, meet: Callable[[], None]) -> None:
        """The job's barrier: ``meet()`` meets every worker through the servers."""
        meet()

    def leaving(self) -> bool:
        """Before the shutdown round: whether this worker says goodbye to the servers (for its party)."""
        return True

    def close(self) -> None:
        """After the worker left the job."""


class CollectiveTier(LanTier):
    """A rank of a ``lan: collective`` party: its ranks' process group, which rank owns each slice, and the requests
    that carry them (``geomx.worker.ranks``)."""

    ranks: PartyRanks

    def __init__(self, ranks: PartyRanks) -> None:
        self.ranks = ranks

    def handles(self, message: Message) -> bool:
        if not EarlyAnswers.is_early(message):
            return False
        self.ranks.on_early(message)  # a collective rank's early sum
        return True

    def init(self, keys: list[int], values: list[torch.Tensor]) -> bool:
        self.ranks.init(keys, values)
        return True

    def refuse_per_key_api(self, what: str) -> None:
        """The kvstore API's per-key calls are a party with a local server's: refused, naming the way."""
        raise RuntimeError(f"kv.{what} in a lan: collective party: the kvstore API keeps GeoMX's semantics in "
                           "parties with a local server; a collective party trains through "
                           "geomx.torch.DistributedOptimizer")

    def for_party(self, ask: Callable[[], int], what: str) -> int:
        """A collective party is one worker to the servers: its rank 0 asks and tells the others."""
        return self.ranks.first_rank_says(ask, what)

    def barrier(self, meet: Callable[[], None]) -> None:
        """The party meets inside first; its rank 0 speaks for it."""
        group = self.ranks.group
        group.barrier()
        if group.rank != 0:
            group.barrier()
            return
        meet()
        group.barrier()

    def leaving(self) -> bool:
        """Every rank is done with its rounds; rank 0 says goodbye for the party."""
        self.ranks.group.barrier()
        return self.ranks.rank == 0

    def close(self) -> None:
        self.ranks.group.close()


def lan_tier(config: NodeConfig, rank: int, sender: SliceSender) -> LanTier:
    """The tier ``config``'s party runs: a ``CollectiveTier`` (joined to its party's process group) in a collective
    party, else a plain ``LanTier``."""
    if not config.topology.is_collective(config.party):
        return LanTier()
    return CollectiveTier(PartyRanks.join(config, rank, sender))
