"""A collective party's process group: its ranks joined as torchrun would join them, every collective bounded by
the topology's round timeout, and a failure named after the party and the operation.

A rank of a ``lan: collective`` party is started by ``geomx launch`` (or by the data center's own ``torchrun``)
with torchrun's variables, which ``geomx.config`` reads into a ``TorchRun``. If the training script already
initialized torch.distributed (as a torchrun script does), the group is that one, its timeout set to the round's;
otherwise it is initialized here from the ``TorchRun``. gloo serves CPU tensors, NCCL CUDA ones.

On gloo, the all-gathers and reduce-scatters go rank to rank (``isend`` / ``irecv`` of each rank's part, the sums in
rank order): gloo's own are 3-3.5x slower on this path. Measured on the 2-core machine, 2 ranks, 32 MB per rank:
all-gather 77 ms against 24 ms for the pairwise exchange, reduce-scatter 113 ms against 32 ms (gloo's all-reduce of
the whole 64 MB: 53 ms). The bytes each rank moves are the same as a ring's; NCCL keeps its own. Rank-to-rank
messages match by tag, so a second *lane* of tags (``lane="answers"``) lets a strategy issue one kind of exchange
(FSA's all-gathers of the answers, as they land during backward) in an order of its own relative to the main lane's:
each lane's exchanges still come in one order on every rank.

Usage::

    group = PartyGroup.join(torchrun, party="dc1", timeout_s=60.0, backend="gloo")
    group.reduce_scatter(chunk, buffer)     # chunk: the party's sum of this rank's chunk of buffer
    group.all_gather(buffer, chunk)
"""

from __future__ import annotations

import contextlib
import datetime
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist

from ..config import TorchRun

log = logging.getLogger("geomx.collective")

# torch renamed the flat-tensor collectives (2.12+: *_single); the older names still work where these do not exist
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
# the rank-to-rank exchanges' tags (gloo's are below 2**24), by lane: each lane numbers its own in a range of its own
LANES = {"main": 0, "answers": 1 << 23}
LANE_TAGS = 1 << 23


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors share storage (a reduce-scatter whose output is part of its input stays gloo's own)."""
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _is_part(chunk: torch.Tensor, buffer: torch.Tensor, rank: int) -> bool:
    """Whether ``chunk`` is exactly ``rank``'s part of ``buffer`` (a reduce-scatter in place: the rank-to-rank one
    sums into it, as it never sends that part)."""
    return (_overlaps(chunk, buffer) and chunk.is_contiguous()
            and chunk.data_ptr() == buffer.data_ptr() + rank * chunk.numel() * buffer.element_size())


class PartyError(RuntimeError):
    """A collective of the party failed: a rank died, hung past the timeout, or disagreed on a shape."""


def backend_for(device: torch.device) -> str:
    """The collective backend for tensors on ``device``: NCCL for CUDA, gloo otherwise."""
    return "nccl" if device.type == "cuda" else "gloo"


class Pending:
    """A collective on its way (one backend work, or a rank-to-rank exchange's sends and receives and the step
    that finishes it); ``wait`` lands it, a failure named as ``PartyGroup``'s are."""

    def __init__(self, group: PartyGroup, what: str, works: list[Any],
                 then: Callable[[], None] | None = None) -> None:
        self.group, self.what, self.works, self.then = group, what, works, then

    def wait(self) -> None:
        self.group._run(self.what, self._finish)

    def _finish(self) -> None:
        for work in self.works:
            work.wait()  # gloo's own timeout (the group's) bounds each
        if self.then is not None:
            then, self.then = self.then, None
            then()

    def done(self) -> bool:
        """Whether the collective has finished (successfully or not: ``wait`` says which), without blocking."""
        return all(work.is_completed() for work in self.works)


def _bound_by_round(party: str, timeout_s: float) -> None:
    """Bound every later collective of the script's own default group (its DDP's and FSDP2's too) by the round
    timeout, as a group initialized here is: the script's own timeout (torch's default: 30 minutes for gloo, 10 for
    NCCL) would let a hung rank hold its party that long. torch sets it with ``_set_pg_timeout`` only."""
    try:
        dist.distributed_c10d._set_pg_timeout(datetime.timedelta(seconds=timeout_s))
    except (AttributeError, RuntimeError, ValueError) as error:  # another torch: the script's timeout stays
        log.warning("[%s] the script's process group keeps its own timeout (%s): a hung rank stops the party only "
                    "after it, not after the topology's round timeout", party, error)
        return
    log.info("[%s] the script's process group: every collective from now on bounded by the round timeout, %.0f s",
             party, timeout_s)


class PartyGroup:
    """The ranks of one party, and the collectives the collective strategies run over them."""

    def __init__(self, party: str, rank: int, world_size: int, group: Any = None) -> None:
        self.party = party
        self.rank = rank
        self.world_size = world_size
        self.group = group  # None: torch.distributed's default group
        self.owns_group = False  # initialized here, so destroyed by close()
        # gloo: all-gathers and reduce-scatters rank to rank (see the module's docstring); each gets a tag of its
        # own, the same on every rank (they issue a group's collectives in one order)
        self.direct = dist.is_initialized() and dist.get_backend(group) == "gloo"
        self._tag = {lane: 0 for lane in LANES}  # each lane's last tag, counted from 0 in its range
        # a group without a CPU backend (a script's init_process_group("nccl")): the few CPU tensors the party
        # agrees on (the model's signature and the wrapper's other keys at INIT, rank 0's word, ESync's flag) go
        # through this rank's GPU (``_on_device``)
        self.stage_cpu = dist.is_initialized() and "cpu:" not in dist.get_backend_config(group)
        self.stage_device: torch.device | None = None  # None: this rank's current GPU

    @classmethod
    def join(cls, run: TorchRun | None, party: str, timeout_s: float, backend: str) -> PartyGroup:
        """The party's group: torch.distributed's default one if the script initialized it, else one initialized
        here from ``run`` (refused, naming what is missing, when there is neither)."""
        if dist.is_initialized():
            _bound_by_round(party, timeout_s)
            return cls(party, dist.get_rank(), dist.get_world_size())
        if run is None:
            raise PartyError(f"party {party} has lan: collective, but this process has no RANK / WORLD_SIZE / "
                             "MASTER_ADDR / MASTER_PORT: start it with `geomx launch` or torchrun")
        log.info("[%s] rank %d of %d joins the party's %s group at %s:%d", party, run.rank, run.world_size,
                 backend, run.master_addr, run.master_port)
        dist.init_process_group(backend, init_method=f"tcp://{run.master_addr}:{run.master_port}", rank=run.rank,
                                world_size=run.world_size, timeout=datetime.timedelta(seconds=timeout_s))
        group = cls(party, run.rank, run.world_size)
        group.owns_group = True
        return group

    def sibling(self, timeout_s: float) -> PartyGroup:
        """A second group over the same ranks, for collectives issued from another thread (each group keeps its own
        order; two threads must not share one). Every rank calls this at the same point."""
        ranks = list(range(self.world_size))
        group = dist.new_group(ranks=ranks, timeout=datetime.timedelta(seconds=timeout_s))
        return PartyGroup(self.party, self.rank, self.world_size, group)

    def _run(self, what: str, op: Callable[[], Any]) -> None:
        try:
            op()
        except (RuntimeError, dist.DistBackendError) as error:
            # the uneven loop is named with its fix: a rank whose data ended first meets this error at its close
            raise PartyError(f"party {self.party}: rank {self.rank}'s {what} failed (a rank of the party died, "
                             "hung past the round timeout, ended its loop at another step than the others (`with "
                             f"opt.join():` evens that out), or disagrees on the model): {error}") from error

    def reduce_scatter_async(self, chunk: torch.Tensor, buffer: torch.Tensor) -> Pending:
        """Start a reduce-scatter (``chunk`` = the party's sum of this rank's chunk); ``wait`` the result."""
        if self.direct and (not _overlaps(chunk, buffer) or _is_part(chunk, buffer, self.rank)):
            return self._exchange("reduce-scatter", buffer, chunk, reduce=True)
        return self._start("reduce-scatter", lambda: _REDUCE_SCATTER(chunk, buffer, group=self.group, async_op=True))

    def all_gather_async(self, buffer: torch.Tensor, chunk: torch.Tensor, lane: str = "main") -> Pending:
        """Start an all-gather (``buffer`` = every rank's ``chunk``); ``wait`` the result. ``lane``: rank to rank,
        the tags it numbers in (see the module's docstring); every rank issues a lane's exchanges in one order."""
        if self.direct:
            return self._exchange("all-gather", buffer, chunk, reduce=False, lane=lane)
        return self._start("all-gather", lambda: _ALL_GATHER(buffer, chunk, group=self.group, async_op=True))

    def _start(self, what: str, op: Callable[[], Any]) -> Pending:
        work: list[Any] = []
        self._run(what, lambda: work.append(op()))
        return Pending(self, what, work)

    def _exchange(self, what: str, buffer: torch.Tensor, chunk: torch.Tensor, reduce: bool,
                  lane: str = "main") -> Pending:
        """gloo's all-gather or reduce-scatter, rank to rank: ``buffer`` holds ``world_size`` parts the size of
        ``chunk``, part ``r`` rank ``r``'s. All-gather: this rank's ``chunk`` to every other, theirs into their
        parts. Reduce-scatter: part ``r`` to rank ``r``, the others' copies of this rank's part into a scratch,
        and ``chunk`` = their sum in rank order (the same order on every rank, whatever arrives first)."""
        size, world, rank = chunk.numel(), self.world_size, self.rank
        if buffer.numel() != size * world:
            raise PartyError(f"party {self.party}: rank {rank}'s {what} needs {world} x {size} elements, got "
                             f"{buffer.numel()}")
        part = lambda r: buffer[r * size:(r + 1) * size]  # noqa: E731
        peers = [r for r in range(world) if r != rank]
        self._tag[lane] = (self._tag[lane] + 1) % LANE_TAGS
        tag = LANES[lane] + self._tag[lane]
        incoming = torch.empty((len(peers), size), dtype=chunk.dtype, device=chunk.device) if reduce else None
        works: list[Any] = []

        def post() -> None:
            for index, peer in enumerate(peers):  # what this rank sends peer, and where peer's lands
                sent, into = (part(peer), incoming[index]) if incoming is not None else (chunk, part(peer))
                works.append(dist.isend(sent, group=self.group, group_dst=peer, tag=tag))
                works.append(dist.irecv(into, group=self.group, group_src=peer, tag=tag))

        self._run(what, post)
        if incoming is None:
            if part(rank).data_ptr() != chunk.data_ptr():
                part(rank).copy_(chunk)
            return Pending(self, what, works)

        def total() -> None:
            rows = iter(incoming)
            terms = [part(r) if r == rank else next(rows) for r in range(world)]
            if len(terms) == 1:
                chunk.copy_(terms[0])
                return
            if rank >= 2 and chunk.data_ptr() == part(rank).data_ptr():  # in place: the sum before this rank's
                before = terms[0]  # part is made in a received row, then added to it (a + b is b + a, exactly)
                for term in terms[1:rank]:
                    before.add_(term)
                chunk.add_(before)
                later = terms[rank + 1:]
            else:
                torch.add(terms[0], terms[1], out=chunk)
                later = terms[2:]
            for term in later:
                chunk.add_(term)

        return Pending(self, what, works, then=total)

    def send_recv_async(self, what: str, messages: int, sends: Sequence[tuple[int, int, torch.Tensor]],
                        recvs: Sequence[tuple[int, int, torch.Tensor]]) -> Pending:
        """Rank-to-rank messages of one exchange over gloo: each of ``sends`` is ``(peer, number, tensor)``, each
        of ``recvs`` ``(peer, number, into)``; a message's ``number`` (below ``messages``, the same count on every
        rank) matches a send to its receive, so every rank of the exchange passes the same ``messages`` and
        numbers its messages alike. Nothing is copied: tensors leave from and land in the caller's buffers (which
        must stay untouched until ``wait``)."""
        if not self.direct:
            raise PartyError(f"party {self.party}: rank {self.rank}'s {what} needs gloo's rank-to-rank messages")
        if messages >= LANE_TAGS:
            raise PartyError(f"party {self.party}: rank {self.rank}'s {what} has {messages} messages, more than the "
                             "tags can number")
        last = self._tag["main"]
        base = last + 1 if last + 1 + messages <= LANE_TAGS else 0  # tags base .. base + messages - 1 (main lane)
        self._tag["main"] = base + messages - 1
        works: list[Any] = []

        def post() -> None:
            for peer, number, tensor in sends:
                works.append(dist.isend(tensor, group=self.group, group_dst=peer, tag=base + number))
            for peer, number, tensor in recvs:
                works.append(dist.irecv(tensor, group=self.group, group_src=peer, tag=base + number))

        self._run(what, post)
        return Pending(self, what, works)

    def reduce_scatter(self, chunk: torch.Tensor, buffer: torch.Tensor) -> None:
        """``chunk`` = the party's sum of this rank's chunk of ``buffer``."""
        self.reduce_scatter_async(chunk, buffer).wait()

    def all_gather(self, buffer: torch.Tensor, chunk: torch.Tensor) -> None:
        """``buffer`` = every rank's ``chunk``, rank by rank."""
        self.all_gather_async(buffer, chunk).wait()

    def all_reduce_async(self, tensor: torch.Tensor) -> Pending:
        """Start an all-reduce (``tensor`` = its sum over the party, in place); ``wait`` the result."""
        return self._start("all-reduce", lambda: dist.all_reduce(tensor, group=self.group, async_op=True))

    def all_reduce(self, tensor: torch.Tensor) -> None:
        """``tensor`` = its sum over the party, in place."""
        with self._on_device(tensor) as moved:
            self._run("all-reduce", lambda: dist.all_reduce(moved, group=self.group))

    def all_to_all(self, output: torch.Tensor, input: torch.Tensor, output_splits: list[int],
                   input_splits: list[int]) -> None:
        """``output`` = what every rank sent this one (``output_splits[r]`` elements from rank ``r``, rank by rank);
        ``input`` holds ``input_splits[r]`` elements for rank ``r``, rank by rank."""
        self._run("all-to-all", lambda: dist.all_to_all_single(output, input, output_splits, input_splits,
                                                               group=self.group))

    def broadcast(self, tensor: torch.Tensor, source: int = 0) -> None:
        """``tensor`` = rank ``source``'s, in place."""
        with self._on_device(tensor) as moved:
            self._run("broadcast", lambda: dist.broadcast(moved, src=source, group=self.group))

    @contextlib.contextmanager
    def _on_device(self, tensor: torch.Tensor) -> Iterator[torch.Tensor]:
        """``tensor``, or, on a group without a CPU backend, a copy of a CPU tensor on this rank's GPU, copied back
        after the collective (a handful of small tensors: the model's own stay on the GPU)."""
        if not self.stage_cpu or tensor.device.type != "cpu":
            yield tensor
            return
        moved = tensor.to(self.stage_device or torch.device("cuda", torch.cuda.current_device()), copy=True)
        yield moved
        tensor.copy_(moved)

    def barrier(self) -> None:
        """Wait for every rank of the party."""
        self._run("barrier", lambda: dist.barrier(group=self.group))

    def close(self) -> None:
        """Destroy the group if it was initialized here (a script's own group is the script's to destroy)."""
        if self.owns_group and dist.is_initialized():
            dist.destroy_process_group()
            self.owns_group = False
