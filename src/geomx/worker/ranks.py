"""A collective party's rank, as the kvstore sees it: the party's process group, which slices this rank owns,
and how its slices meet the global servers.

In a ``lan: collective`` party every rank connects to the global servers itself (as a flat worker would) and
owns some slices (``geomx.collective.owners``): it INITs and pushes only those, through the kvstore's own slice
sender (``geomx.worker.sender``), and the party's collectives bring the others' answers to it. The global servers
see the party's ranks as one client (``Clients.group``). Early sums are settled by the one client of
``geomx.core.early``, adding the others' sum into the piece when the round's bare answer arrives.

Usage (by the kvstore's ``CollectiveTier``, ``geomx.worker.tier``; the collective strategies reach it as
``loop.ranks``, through the seam ``geomx.core.ranks.PartyRanks``)::

    ranks = PartyRanks.join(node_config, rank, SliceSender(requests, keys, route, codecs, timeout_s))
    ranks.init([0, 1], [weight, bias])            # every rank ends with the master's values
    ranks.exchange(pieces, priority)              # this rank's slices: pushed, answers written back in place
    bucket = ranks.party_model(params)           # the model as this rank holds it (whole, or FSDP2 shards)

Under FSDP2 (``geomx.collective.fsdp``) the parameters are DTensors and a rank holds its shard of each: ``init``
prefers as owner of each slice the rank whose shard holds it, moves the central party's initial values from the
shards to the owners (``geomx.collective.sharded``), and the answers back into the shards; nobody gathers the
whole model, and no rank's values are broadcast (FSDP2 sharded one model: every rank holds its part of it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future

import numpy as np
import torch

from ..codecs import Codec, worker_codec
from ..codecs.base import TensorKind
from ..collective.fsdp import LocalShards, fsdp_shards, local_flat
from ..collective.group import PartyGroup
from ..collective.layout import OwnerLayout
from ..collective.owners import OwnedSlice, SliceOwners
from ..collective.party_model import PartyModel, WholePartyModel, bucket_like
from ..collective.sharded import ShardedPartyModel
from ..config import ConfigError, NodeConfig
from ..core.early import EarlyAnswers, Settle
from ..core.inits import MOVED, value_digest
from ..core.rounds import MODEL_CHANGE, SAME
from ..core.strategy import WRAPPER_KEYS
from ..protocol.tensors import host_numpy, wire_dtype
from ..protocol.wire import Message, SliceId
from .sender import SliceSender
from .slices import to_numpy


class PartyRanks:
    """This rank's party group, the owners of every slice the kvstore declared, and their traffic."""

    def __init__(self, group: PartyGroup, central: bool, sender: SliceSender, size_lower_bound: int = 200_000) -> None:
        self.group = group
        self.sender = sender
        self.owners = SliceOwners(group.world_size)
        self.local_shards: LocalShards | None = None  # the keys an FSDP2 script sharded, once init has seen them
        # the central party's owners carry the initial values (rank 0's, broadcast first: it is the master)
        self.carries_values = central
        self.size_lower_bound = size_lower_bound  # the topology's, for codecs with a size bound, as the master's
        self.codec: Codec | None = None  # the job's WAN codec: each rank encodes the slices it owns (residuals too)
        # early answers (geomx.core.early): the other parties' sum of a slice, ahead of the round's answer; stored by
        # the van's thread, added to the piece once the round's tensor-less answer arrives
        self.early = EarlyAnswers(Settle.ON_REPLY)
        # whether INITs carry the digest of what this rank holds: not once an answer said the job's model moved
        # since its global servers started (``geomx.core.inits.MOVED``: a restarted party's seed cannot match it)
        self.digests = True

    def use_compression(self, spec: dict[str, object]) -> None:
        """Encode this rank's pushes with the job's WAN codec ``spec`` (as a local server encodes its party's)."""
        _, self.codec = worker_codec(self.sender.codecs, spec, self.size_lower_bound)

    @classmethod
    def join(cls, config: NodeConfig, rank: int, sender: SliceSender) -> PartyRanks:
        """Join the party's group: gloo for CPU tensors, NCCL as well where CUDA is there; every collective bounded
        by the topology's round timeout."""
        run = config.torchrun
        if run is not None and run.rank != rank:
            raise ConfigError(f"{config.party}: torchrun's RANK={run.rank}, but the global scheduler assigned rank "
                              f"{rank} (another process asked for the same rank)")
        backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
        group = PartyGroup.join(run, config.party, config.topology.timeouts.round_s, backend)
        if group.world_size != config.num_workers:
            raise ConfigError(f"party {config.party} has {config.num_workers} workers in the topology, but its "
                              f"process group has {group.world_size} ranks")
        return cls(group, config.party == config.topology.central, sender, config.topology.size_lower_bound)

    @property
    def rank(self) -> int:
        return self.group.rank

    def first_rank_says(self, ask: Callable[[], int], what: str) -> int:
        """``ask()`` (a number >= 0) on rank 0, its answer given to every rank: rank 0 speaks for the party (a state
        round, say). If ``ask`` raises, rank 0 raises it and the others raise at once, naming ``what``, rather
        than at the broadcast's timeout."""
        answer = torch.full((1,), -1, dtype=torch.int64)
        failure: Exception | None = None
        if self.group.rank == 0:
            try:
                answer[0] = ask()
            except Exception as exc:  # re-raised below, once the other ranks know
                failure = exc
        self.group.broadcast(answer, source=0)
        if failure is not None:
            raise failure
        if answer[0] < 0:
            raise RuntimeError(f"party {self.group.party}: rank 0 failed {what} for the party (its log says why)")
        return int(answer[0])

    def owns(self, key: int, index: int) -> bool:
        return self.owners.owner(key, index) == self.group.rank

    def owner(self, key: int, index: int) -> int:
        """The rank owning slice ``index`` of ``key``."""
        return self.owners.owner(key, index)

    def init(self, keys: list[int], values: list[torch.Tensor]) -> None:
        """Every rank declares every key; each slice's owner INITs it (with rank 0's values in the central party:
        the master's) and broadcasts the answer to the party. FSDP2 local shards (DTensors) go to their owners and back
        instead (``_init_sharded``)."""
        table = self.sender.keys
        local_shards = fsdp_shards(values, self.group.world_size, [f"key {k}" for k in keys], self.group.party, keys)
        declared = []
        for k, v in zip(keys, values, strict=True):
            if not v.is_contiguous():
                raise ValueError(f"init of key {k}: a collective party needs contiguous tensors")
            info = table.add(k, v)
            declared.append((k, info.slices, v.element_size() if k < WRAPPER_KEYS else 0))
        # the wrapper's own keys (its model signature) weigh nothing; a slice inside one rank's shard is its own
        self.owners.add_many(declared, prefer=local_shards.holder if local_shards is not None else None)
        if local_shards is not None:
            self._init_sharded(keys, values, local_shards)
            return
        if self.carries_values:
            for v in values:
                self.group.broadcast(v.data, source=0)
        pending = []
        for k, v in zip(keys, values, strict=True):
            # no copy: a slice's range of ``v`` changes only once its own answer is in (its frames are sent), and
            # the broadcasts below only after every answer; a copy would cost the whole model once more at init
            data = to_numpy(v, snapshot=False)
            for index, (start, stop) in enumerate(table[k].slices):
                if self.owns(k, index):
                    pending.append((v, k, index, start, stop, self._send_init(k, index, data[start:stop])))
        moved = torch.zeros(1)
        for v, k, index, start, stop, future in pending:
            reply = self.sender.reply(future, k, index, "INIT")
            moved += bool((reply.body or {}).get(MOVED))
            if _same(reply):
                continue  # it holds the global value already (its digest matched): nothing came, nothing moves
            v.data.view(-1)[start:stop].copy_(self.sender.data(reply, k, index))
        for k, v in zip(keys, values, strict=True):
            flat = v.data.view(-1)
            for index, (start, stop) in enumerate(table[k].slices):
                self.group.broadcast(flat[start:stop], source=self.owners.owner(k, index))
        if self.digests:  # every rank learns what an owner's answer said (the wrapper's signature comes first)
            self.group.all_reduce(moved)
            self.digests = not moved.item()

    def _init_sharded(self, keys: list[int], values: list[torch.Tensor], local_shards: LocalShards) -> None:
        """INIT of FSDP2-sharded keys: the central party's owners get their slices' values from the local shards
        holding them, each owner INITs its slices, and the answers go back into the local shards (two all-to-alls
        at most)."""
        self.local_shards = local_shards if self.local_shards is None else self.local_shards.merged(local_shards)
        # the INIT values as the servers hold them: exact
        model = ShardedPartyModel(local_shards, self.layout(keys), self.group, like=_wire_like(map(local_flat, values)))
        views = model.views(values)
        model.own(views)  # every party: the values to send (central) or the bytes its digests describe
        futures = [self._send_init(owned.key, owned.index, host_numpy(piece))
                   for owned, piece in model.pieces]
        for (owned, piece), future in zip(model.pieces, futures, strict=True):
            reply = self.sender.reply(future, owned.key, owned.index, "INIT")
            if not _same(reply):  # else the piece holds the global value already
                piece.copy_(self.sender.data(reply, owned.key, owned.index))
        model.spread(views)

    def _send_init(self, key: int, index: int, piece: np.ndarray) -> Future[Message]:
        """INIT one slice this rank owns (with ``piece``'s values in the central party); the answer's future."""
        # the digest of what this rank holds, so the same weights do not cross the WAN again (nor come back to the
        # central party, whose values they are: an answer of half the model in flight at once on each of its ranks)
        digest = value_digest(piece) if self.digests else None
        return self.sender.init(key, index, piece, self.carries_values, digest=digest)

    def party_model(self, params: Sequence[torch.Tensor]) -> PartyModel:
        """The model as this rank holds it, with its owned slices: whole on every rank, or FSDP2's local shards. Its
        chunk is in the dtype the servers hold (float32 for a bfloat16 model: ``geomx.protocol.tensors``)."""
        like = _wire_like(local_flat(p) if self.local_shards is not None else p.data for p in params)
        if self.local_shards is not None:
            return ShardedPartyModel(self.local_shards, self.layout(), self.group, like=like)
        return WholePartyModel(self.layout(), self.group, like=like)

    def exchange(self, pieces: Sequence[tuple[OwnedSlice, torch.Tensor]], priority: Sequence[int],
                 kind: TensorKind = "gradient", bases: Sequence[torch.Tensor] | None = None) -> None:
        """A rank's round: push each owned slice's ``piece`` (its party's sum, or delta) to the global server
        holding it, and write each answer into the same ``piece``. Blocks until every answer is in. ``bases``:
        see ``land``."""
        self.land(pieces, self.send(pieces, priority, kind), bases)

    def send(self, pieces: Sequence[tuple[OwnedSlice, torch.Tensor]], priority: Sequence[int],
             kind: TensorKind = "gradient", tokens: Mapping[SliceId, int] | None = None) -> list[Future[Message]]:
        """Push each ``piece`` (not to be changed until ``land``), encoded by the job's WAN codec if one is set
        (``kind``: what the piece holds, for the codec; ``tokens``: the samples behind each slice's piece, reported
        in its body: decoupled rounds), those for one global server as one message (a BUNDLE; a single piece as a
        plain PUSHPULL); returns the answers' futures, one per piece."""
        counts = tokens or {}
        # each piece's data: a view on the CPU (the answer only lands after the send); bfloat16: a copy, and it
        # travels as bfloat16's bits, exact, where the route carries codecs' payloads (FSA's party sums)
        # the pieces for one global server leave together, as few BUNDLEs as fit (geomx.protocol.wire.bundled)
        return self.sender.push_together([
            self.sender.pushpull(owned.key, owned.index, host_numpy(piece), self.sender.codec(self.codec, piece),
                                 priority[owned.key] if owned.key < len(priority) else 0, kind,
                                 counts.get((owned.key, owned.index)))
            for owned, piece in pieces])

    def on_early(self, message: Message) -> None:
        """The other parties' sum of a slice this rank owns, sent ahead (the van's thread)."""
        self.early.store(message.sender.decode(), message)

    def land(self, pieces: Sequence[tuple[OwnedSlice, torch.Tensor]], futures: Sequence[Future[Message]],
             bases: Sequence[torch.Tensor] | None = None) -> None:
        """Write each answer of ``send`` into its ``piece``, waiting at most the request timeout for each. An
        answer without a tensor closes a round answered early: the answer is the others' sum plus this party's
        (the piece as pushed); the early sum came first, on the same connection; or, flagged ``ALONE``, nobody
        else pushed and the answer is the piece as pushed. An answer flagged as a model
        change (weights under a residual codec: the global model's change since the last answer, compressed) is
        added to the slice's last global model, ``bases`` (one per piece)."""
        sender = self.sender
        for index, ((owned, piece), future) in enumerate(zip(pieces, futures, strict=True)):
            reply = sender.reply(future, owned.key, owned.index, "PUSHPULL")
            if EarlyAnswers.bare(reply):
                try:
                    others = self.early.others(sender.server(owned.key, owned.index), reply)
                except LookupError as exc:
                    raise RuntimeError(f"{sender.server_name(owned.key, owned.index)} {exc}") from None
                if others is not None:  # else this party alone pushed the slice: the answer is the piece as pushed
                    piece.add_(torch.from_numpy(np.asarray(others, dtype=np.float32)).to(piece.device))
            elif (reply.body or {}).get(MODEL_CHANGE):
                if bases is None:
                    raise RuntimeError(f"{sender.server_name(owned.key, owned.index)} sent a model change of key "
                                       f"{owned.key} slice {owned.index}, but this rank holds no global model of it")
                change = sender.data(reply, owned.key, owned.index).to(piece.device)
                torch.add(bases[index].to(piece.device), change, out=piece)  # no sum allocated, then copied
            else:
                piece.copy_(sender.data(reply, owned.key, owned.index))

    def layout(self, keys: Sequence[int] | None = None) -> OwnerLayout:
        """The owner-ordered layout of ``keys`` (default: the model's, every key below the wrapper's own)."""
        table = self.sender.keys
        chosen = list(keys) if keys is not None else sorted(k for k in table if k < WRAPPER_KEYS)
        return OwnerLayout(self.owners, {k: math.prod(table.info(k).shape) for k in chosen})

    def slice_sizes(self) -> dict[tuple[int, int], int]:
        """Elements of every declared slice, by (key, slice), as a local server would hold them."""
        return {(k, index): stop - start for k, info in self.sender.keys.items()
                for index, (start, stop) in enumerate(info.slices)}


def _wire_like(tensors: Iterable[torch.Tensor]) -> torch.Tensor:
    """An empty tensor of ``tensors``' device and of the dtype the servers hold the party's model in (the widest of
    theirs, float32 for bfloat16: ``geomx.protocol.tensors``): what a rank's owned chunk is kept in."""
    held = bucket_like(list(tensors))
    return held.new_empty(0, dtype=wire_dtype(held.dtype))


def _same(reply: Message) -> bool:
    """Whether an INIT's answer says the rank holds the global value already (its digest matched; no value came)."""
    return bool((reply.body or {}).get(SAME)) and reply.tensor is None and reply.encoded is None

