"""A collective party's rank, as the kvstore sees it: the party's process group, which slices this rank owns,
and how its slices meet the global servers.

In a ``lan: collective`` party every rank connects to the global servers itself (as a flat worker would) and
owns some slices (``geomx.collective.owners``): it INITs and pushes only those, and the party's collectives bring
the others' answers to it. The global servers see the party's ranks as one client (``Clients.group``).

Usage (inside ``KVStore``; the collective strategies reach it as ``kv.ranks``)::

    ranks = PartyRanks.join(node_config, rank, SliceLink(requests, keys, route, codecs, timeout_s))
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
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..codecs import Codec, Registry, worker_codec
from ..codecs.base import TensorKind
from ..codecs.messages import decode_message
from ..collective.bucket import PartyModel, WholePartyModel, bucket_like
from ..collective.fsdp import LocalShards, fsdp_shards, local_flat
from ..collective.group import PartyGroup
from ..collective.layout import OwnerLayout
from ..collective.owners import OwnedSlice, SliceOwners
from ..collective.sharded import ShardedPartyModel
from ..config import ConfigError, NodeConfig
from ..core.inits import value_digest
from ..core.rounds import ALONE, EARLY, MODEL_CHANGE, SAME
from ..core.strategy import WRAPPER_KEYS
from ..core.worker_plugins import PushRoute
from ..protocol.bodies import InitBody, encode_body
from ..protocol.tensors import host_numpy, readonly_tensor, wire_dtype
from ..protocol.wire import Kind, Message
from ..transport.rpc import Requests
from .slices import KeyTable, payload, push_codec, to_numpy


@dataclass
class SliceLink:
    """What a rank needs of its kvstore to send slices: requests, the keys' slices, the push route, codecs."""

    requests: Requests
    keys: KeyTable
    route: PushRoute
    codecs: Registry
    timeout_s: float

    def server_name(self, key: int, index: int) -> str:
        return self.requests.names.get(self.keys.server_for(key, index), "?")

    def reply(self, future: Any, key: int, index: int, what: str) -> Message:
        """A slice's answer, waiting at most the request timeout."""
        return self.requests.wait(future, self.timeout_s, f"{self.server_name(key, index)} to answer {what} of "
                                                          f"key {key} slice {index}")

    def answer(self, future: Any, key: int, index: int, what: str) -> torch.Tensor:
        """The data of a slice's answer (a read-only tensor), waiting at most the request timeout."""
        return self.data(self.reply(future, key, index, what), key, index)

    def data(self, reply: Message, key: int, index: int) -> torch.Tensor:
        """The decoded data of ``reply`` (a read-only tensor)."""
        data = decode_message(self.codecs, reply)
        if data is None:
            raise RuntimeError(f"{self.server_name(key, index)} answered key {key} slice {index} without data")
        return readonly_tensor(data)


class PartyRanks:
    """This rank's party group, the owners of every slice the kvstore declared, and their traffic."""

    def __init__(self, group: PartyGroup, central: bool, link: SliceLink, size_lower_bound: int = 200_000) -> None:
        self.group = group
        self.link = link
        self.owners = SliceOwners(group.world_size)
        self.local_shards: LocalShards | None = None  # the keys an FSDP2 script sharded, once init has seen them
        # the central party's owners carry the initial values (rank 0's, broadcast first: it is the master)
        self.carries_values = central
        self.size_lower_bound = size_lower_bound  # the topology's, for codecs with a size bound, as the master's
        self.codec: Codec | None = None  # the job's WAN codec: each rank encodes the slices it owns (residuals too)
        # FSA's early answers (geomx.core.early): the other parties' sum of a slice, ahead of the round's answer;
        # stored by the van's thread, taken by the training thread once the round's tensor-less answer arrives (by
        # round: the next round's early sum may come before this thread has taken this round's)
        self._early: dict[tuple[int, int, int], np.ndarray] = {}
        self._early_lock = threading.Lock()

    def use_compression(self, spec: dict[str, Any]) -> None:
        """Encode this rank's pushes with the job's WAN codec ``spec`` (as a local server encodes its party's)."""
        _, self.codec = worker_codec(self.link.codecs, spec, self.size_lower_bound)

    @classmethod
    def join(cls, config: NodeConfig, rank: int, link: SliceLink) -> PartyRanks:
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
        return cls(group, config.party == config.topology.central, link, config.topology.size_lower_bound)

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

    def init(self, keys: list[int], values: list[torch.Tensor]) -> None:
        """Every rank declares every key; each slice's owner INITs it (with rank 0's values in the central party:
        the master's) and broadcasts the answer to the party. FSDP2 local shards (DTensors) go to their owners and back
        instead (``_init_sharded``)."""
        table = self.link.keys
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
        for v, k, index, start, stop, future in pending:
            reply = self.link.reply(future, k, index, "INIT")
            if _same(reply):
                continue  # it holds the global value already (its digest matched): nothing came, nothing moves
            v.data.view(-1)[start:stop].copy_(self.link.data(reply, k, index))
        for k, v in zip(keys, values, strict=True):
            flat = v.data.view(-1)
            for index, (start, stop) in enumerate(table[k].slices):
                self.group.broadcast(flat[start:stop], source=self.owners.owner(k, index))

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
            reply = self.link.reply(future, owned.key, owned.index, "INIT")
            if not _same(reply):  # else the piece holds the global value already
                piece.copy_(self.link.data(reply, owned.key, owned.index))
        model.spread(views)

    def _send_init(self, key: int, index: int, piece: np.ndarray) -> Any:
        """INIT one slice this rank owns (with ``piece``'s values in the central party); the answer's future."""
        info = self.link.keys[key]
        # the digest of what this rank holds, so the same weights do not cross the WAN again (nor come back to the
        # central party, whose values they are: an answer of half the model in flight at once on each of its ranks)
        digest = value_digest(piece)
        message = Message(Kind.INIT, key=key, slice=index, num_slices=len(info.slices),
                          tensor=piece if self.carries_values else None, dtype=piece.dtype, shape=piece.shape,
                          body=encode_body(InitBody(shard=info.shards[index], numel=math.prod(info.shape),
                                                    digest=digest)))
        return self.link.requests.call(self.link.keys.server_for(key, index), message)

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
             kind: TensorKind = "gradient") -> list[Any]:
        """Push each ``piece`` (not to be changed until ``land``), encoded by the job's WAN codec if one is set
        (``kind``: what the piece holds, for the codec); returns the answers' futures."""
        futures = []
        for owned, piece in pieces:
            data = host_numpy(piece)  # a view on the CPU (the answer only lands after the send); bfloat16: a copy
            # a bfloat16 piece (FSA's party sums) as bfloat16's bits, exact, where the route carries codecs' payloads
            codec = push_codec(self.codec, piece, self.link.route.carries_codecs)
            fields = payload(codec, owned.key, owned.index, data, math.prod(self.link.keys.info(owned.key).shape), kind)
            message = Message(Kind.PUSHPULL, key=owned.key, slice=owned.index, num_slices=owned.num_slices,
                              priority=priority[owned.key] if owned.key < len(priority) else 0, **fields)
            futures.append(self.link.route.push(self.link.keys.server_for(owned.key, owned.index), message))
        return futures

    def on_early(self, message: Message) -> None:
        """The other parties' sum of a slice this rank owns, sent ahead (the van's thread)."""
        assert message.tensor is not None and message.body is not None
        with self._early_lock:
            self._early[(message.key, message.slice, int(message.body[EARLY]))] = message.tensor

    def land(self, pieces: Sequence[tuple[OwnedSlice, torch.Tensor]], futures: Sequence[Any],
             bases: Sequence[torch.Tensor] | None = None) -> None:
        """Write each answer of ``send`` into its ``piece``, waiting at most the request timeout for each. An
        answer without a tensor closes a round answered early: the answer is the others' sum plus this party's
        (the piece as pushed); the early sum came first, on the same connection; or, flagged ``ALONE``, nobody
        else pushed and the answer is the piece as pushed. An answer flagged as a model
        change (weights under a residual codec: the global model's change since the last answer, compressed) is
        added to the slice's last global model, ``bases`` (one per piece)."""
        for index, ((owned, piece), future) in enumerate(zip(pieces, futures, strict=True)):
            reply = self.link.reply(future, owned.key, owned.index, "PUSHPULL")
            body = reply.body or {}
            if reply.tensor is None and reply.encoded is None and EARLY in body:
                if body.get(ALONE):
                    continue  # this party alone pushed the slice: the answer is the piece as pushed
                with self._early_lock:
                    others = self._early.pop((owned.key, owned.index, int(body[EARLY])), None)
                if others is None:
                    raise RuntimeError(f"{self.link.server_name(owned.key, owned.index)} closed round {body[EARLY]} "
                                       f"of key {owned.key} slice {owned.index} early, but its early sum never came")
                piece.add_(torch.from_numpy(np.asarray(others, dtype=np.float32)).to(piece.device))
            elif body.get(MODEL_CHANGE):
                if bases is None:
                    raise RuntimeError(f"{self.link.server_name(owned.key, owned.index)} sent a model change of key "
                                       f"{owned.key} slice {owned.index}, but this rank holds no global model of it")
                change = self.link.data(reply, owned.key, owned.index).to(piece.device)
                torch.add(bases[index].to(piece.device), change, out=piece)  # no sum allocated, then copied
            else:
                piece.copy_(self.link.data(reply, owned.key, owned.index))

    def layout(self, keys: Sequence[int] | None = None) -> OwnerLayout:
        """The owner-ordered layout of ``keys`` (default: the model's, every key below the wrapper's own)."""
        table = self.link.keys
        chosen = list(keys) if keys is not None else sorted(k for k in table if k < WRAPPER_KEYS)
        return OwnerLayout(self.owners, {k: math.prod(table.info(k).shape) for k in chosen})

    def slice_sizes(self) -> dict[tuple[int, int], int]:
        """Elements of every declared slice, by (key, slice), as a local server would hold them."""
        return {(k, index): stop - start for k, info in self.link.keys.items()
                for index, (start, stop) in enumerate(info.slices)}


def _wire_like(tensors: Iterable[torch.Tensor]) -> torch.Tensor:
    """An empty tensor of ``tensors``' device and of the dtype the servers hold the party's model in (the widest of
    theirs, float32 for bfloat16: ``geomx.protocol.tensors``): what a rank's owned chunk is kept in."""
    held = bucket_like(list(tensors))
    return held.new_empty(0, dtype=wire_dtype(held.dtype))


def _same(reply: Message) -> bool:
    """Whether an INIT's answer says the rank holds the global value already (its digest matched; no value came)."""
    return bool((reply.body or {}).get(SAME)) and reply.tensor is None and reply.encoded is None


def refuse_per_key_api(ranks: PartyRanks | None, what: str) -> None:
    """The kvstore API's per-key calls are a party with a local server's: refused, naming the way, where the
    worker is a rank of a collective party (``ranks``)."""
    if ranks is not None:
        raise RuntimeError(f"kv.{what} in a lan: collective party: the kvstore API keeps GeoMX's semantics in "
                           "parties with a local server; a collective party trains through "
                           "geomx.torch.DistributedOptimizer")
