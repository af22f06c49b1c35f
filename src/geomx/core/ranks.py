"""The seam through which a worker strategy reaches its party: the kvstore it trains through (``Store``) and, in a
``lan: collective`` party, the party's ranks (``PartyRanks``): its process group, which rank owns each slice, and
the rounds of the slices this rank owns.

Strategies (``geomx.algorithms``) see these interfaces only; ``geomx.kv.KVStore`` and
``geomx.worker.ranks.PartyRanks`` implement them, two layers above, so an algorithm never imports the worker.

Usage (inside a collective strategy; ``loop.ranks`` is None in a party with a local server)::

    ranks = loop.ranks
    if ranks.owns(key, 0): ...
    ranks.exchange(pieces, loop.priority, kind="delta", bases=bases)   # pushed, answers written back in place
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Protocol

from ..codecs.base import TensorKind
from ..config import NodeConfig
from ..protocol.wire import Message, SliceId

if TYPE_CHECKING:  # the servers never import torch; only the workers' strategies use it at run time
    import torch


class Store(Protocol):
    """What a strategy uses of its worker's kvstore (``geomx.kv.KVStore``)."""

    config: NodeConfig  # its typed config (the topology's training options, say)
    name: str  # this worker's name, for messages
    num_workers: int  # this party's workers
    num_all_workers: int  # the job's workers

    def init(self, key: int | Sequence[int], value: torch.Tensor | Sequence[torch.Tensor]) -> None: ...

    def push(self, key: int | Sequence[int], value: torch.Tensor | Sequence[torch.Tensor],
             priority: int = 0, tokens: int | None = None) -> None: ...

    def pull(self, key: int | Sequence[int], out: torch.Tensor | Sequence[torch.Tensor],
             priority: int = 0) -> None: ...

    def pull_job_model(self, key: int | Sequence[int], out: torch.Tensor | Sequence[torch.Tensor]) -> None: ...

    def assign_local_steps(self, seconds_per_step: float, base_steps: int) -> int: ...


class RankGroup(Protocol):
    """What a strategy asks of its party's process group (``geomx.collective.group.PartyGroup``)."""

    party: str
    rank: int
    world_size: int
    direct: bool  # rank-to-rank messages (gloo): collectives may run on threads of their own

    def all_reduce(self, tensor: torch.Tensor) -> None: ...

    def broadcast(self, tensor: torch.Tensor, source: int = 0) -> None: ...

    def barrier(self) -> None: ...

    def sibling(self, timeout_s: float) -> RankGroup: ...


class OwnedPiece(Protocol):
    """A slice as its owner sees it (``geomx.collective.owners.OwnedSlice``)."""

    @property
    def key(self) -> int: ...

    @property
    def index(self) -> int: ...

    @property
    def num_slices(self) -> int: ...


Pieces = Sequence[tuple[OwnedPiece, "torch.Tensor"]]


class PartyRanks(Protocol):
    """What a strategy uses of its collective party's ranks (``geomx.worker.ranks.PartyRanks``)."""

    group: RankGroup

    @property
    def rank(self) -> int: ...

    def owns(self, key: int, index: int) -> bool:
        """Whether this rank owns slice ``index`` of ``key``."""

    def owner(self, key: int, index: int) -> int:
        """The rank owning slice ``index`` of ``key``."""

    def slice_sizes(self) -> dict[SliceId, int]:
        """Elements of every declared slice."""

    # The two below build ``geomx.collective`` objects (an ``OwnerLayout``, a ``PartyModel``): a layer above this
    # one, which cannot name them; the strategies that call these type what they get by those names.
    def layout(self, keys: Sequence[int] | None = None) -> Any:
        """The owner-ordered layout of ``keys`` (default: the model's)."""

    def party_model(self, params: Sequence[torch.Tensor]) -> Any:
        """The model as this rank holds it (whole, or FSDP2's local shards), with its owned slices."""

    def send(self, pieces: Pieces, priority: Sequence[int], kind: TensorKind = "gradient",
             tokens: Mapping[SliceId, int] | None = None) -> list[Future[Message]]:
        """Push each owned piece (unchanged until ``land``; ``tokens``: the samples behind each slice's, reported in
        its body); the answers' futures."""

    def land(self, pieces: Pieces, futures: Sequence[Future[Message]],
             bases: Sequence[torch.Tensor] | None = None) -> None:
        """Write each answer of ``send`` into its piece (``bases``: the slices' last global models)."""

    def exchange(self, pieces: Pieces, priority: Sequence[int], kind: TensorKind = "gradient",
                 bases: Sequence[torch.Tensor] | None = None) -> None:
        """``send``, then ``land``."""

