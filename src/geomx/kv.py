"""The worker's KVStore, shaped like MXNet's ``mx.kv`` so GeoMX training loops port line by line.

``push`` sends a gradient and returns at once; ``pull`` waits for that round's result (push and pull are
one fused request per slice: one round trip per tier). Keys are ints; lists of keys and tensors work.

Usage::

    kv = geomx.kv.create("dist_sync")              # role and topology come from `geomx launch`
    if kv.is_master_worker:
        kv.set_optimizer(geomx.optim.Adam(lr=1e-3))
    for idx, p in enumerate(model.parameters()):
        kv.init(idx, p.data)                       # every worker now holds the master's weights
    ...
    kv.push(idx, p.grad, priority=-idx); kv.pull(idx, p.data, priority=-idx)
    kv.close()
"""

from __future__ import annotations

import atexit
import functools
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from contextlib import AbstractContextManager
from typing import Any

import torch

from .algorithms.registry import SYNC_POLICIES, sync_policy
from .cluster.heartbeat import pulse_for
from .cluster.membership import JoinRefused, Tier, is_server, join, new_node_id, scheduler_id
from .codecs import default_registry, worker_codec
from .config import ConfigError, Mode, NodeConfig, Role, node_config
from .core.sharding import ShardPlanner
from .core.strategy import STEP_KEY
from .core.worker_plugins import WorkerContext
from .optim import Optimizer
from .protocol.bodies import ConfigureBody, PullBody, decode_body, encode_body
from .protocol.wire import Kind, Message
from .runs.runlog import StatsFile, append_metrics
from .server.compose import check_plugins
from .transport.rpc import Requests
from .transport.trace import Tracer
from .transport.van import Van
from .worker.calls import KnownKeys, checked, paired
from .worker.compose import compose_worker
from .worker.exits import LeaveAtExit, quiet_failures
from .worker.ranks import PartyRanks
from .worker.sender import SliceSender
from .worker.slices import copy_out, to_numpy
from .worker.tier import LanTier, lan_tier

log = logging.getLogger("geomx.kv")

KVSTORE_TYPES = tuple(SYNC_POLICIES)


class KVStore(AbstractContextManager["KVStore"]):
    """A worker's connection to its party's local server (or, in flat mode, to the global servers)."""

    def __init__(self, kind: str, config: NodeConfig) -> None:
        if config.role is not Role.WORKER:
            raise ValueError(f"kv.create runs on workers; this process has role {config.role.value}")
        self.policy = sync_policy(kind)  # validates the type string; the rules of the top tier's rounds
        check_plugins(config.topology.training, config.topology)  # bad names, codecs, options: named before joining
        self.type = kind
        self.config = config
        self._topology = config.topology
        self._timeout = config.topology.timeouts.request_s
        self._codecs = default_registry()
        # per key, the answers of every push since its last pull, a future per slice, oldest push first (pushing a
        # key again before its pull is legal, as in MXNet: each push is a round, and the pull waits for them all)
        self._pending: dict[int, list[Future[Message]]] = {}
        identity = new_node_id(Role.WORKER, config.party)
        self._van = Van(identity, config.party, config.topology, self._on_message, bind_host=config.bind_host,
                        name=f"{config.party}/worker")
        self._requests = Requests(self._van)
        self._handles: Callable[[Message], bool] = lambda _message: False  # the push route's hook, once joined
        self._tier = LanTier()  # beneath the kvstore: a collective party's rank, once joined (geomx.worker.tier)
        self._van.start()
        # flat, or a collective party's rank: the global servers under the global scheduler; HiPS: the party's
        # local server under its own
        self.collective = config.topology.is_collective(config.party)
        flat = config.topology.mode is Mode.FLAT or self.collective
        tier = Tier.GLOBAL if flat else Tier.PARTY
        requested = config.torchrun.rank if self.collective and config.torchrun is not None else config.rank
        book, me = join(self._van, self._requests, config, tier, rank=requested, connect=is_server,
                        master=config.is_master)
        self._servers = [m.id for m in book.of_role(Role.GLOBAL_SERVER if flat else Role.LOCAL_SERVER)]
        self._scheduler = scheduler_id(config, tier)
        # every worker of the job plans alike: collective parties spread a large tensor over their ranks
        collective = config.topology.collective_parties
        spread = max((p.num_workers for p in config.topology.parties if p.name in collective), default=1)
        self._keys = KnownKeys(ShardPlanner(config.topology.num_global_servers, config.topology.slice_elems, spread),
                               self._servers)
        self.init_s = 0.0  # seconds spent in ``init``: the keys' values from the servers (into every rank of a party)
        plugins = compose_worker(config, WorkerContext(self._van, self._requests, self._servers, book, me,
                                                       self._timeout))
        self._plugins = plugins  # the caller's tensors keep their dtype whatever the LAN codec; INIT stays exact
        self._route, self._steps = plugins.route, plugins.steps
        self._sender = SliceSender(self._requests, self._keys, self._route, self._codecs, self._timeout)
        self._handles = self._route.handles
        self.rank = me.rank
        self.name = me.name
        self._van.name = me.name
        self._van.tracer = Tracer.for_node(config.trace, config.run_dir, me.name)
        self.pulse = pulse_for(self._van, self._requests, config.topology.timeouts)  # pulse.note(step=...): heartbeats
        # with the model digests this worker took last (the wrapper's, where parties hold one model: geomx.torch.digest)
        self._stats_file = StatsFile(config.run_dir, me.name, lambda: {"role": "worker", "party": config.party,
                                                                      **self._van.counters.snapshot(),
                                                                      "models": self.pulse.models()}).start()
        self.party = config.party
        self.hfa = config.topology.hfa  # the API's kv.hfa (HFASpec(k1, k2) or None): the training loop's K1
        self.num_workers = config.num_workers
        self.num_all_workers = config.topology.num_all_workers
        offset = config.worker_offset
        if offset is None:
            offset = config.topology.worker_offset(config.party)
        self.global_rank = offset + self.rank
        # The scheduler decides: the flagged worker (GEOMX_MASTER_WORKER / DMLC_ROLE_MASTER_WORKER), else rank 0
        # of the central party.
        self.is_master_worker = me.master
        self._exit_hook: Callable[[], None] | None = None  # close_at_exit's
        # a collective party (lan: collective): its ranks' process group, which rank owns each slice, and the
        # slices they send (geomx.worker.tier, geomx.worker.ranks)
        self._tier = lan_tier(config, me.rank, self._sender)
        if self.is_master_worker:  # before any init round completes, so every push meets the right policy
            self._configure(ConfigureBody(sync=kind), f"switch to {kind}")

    @property
    def ranks(self) -> PartyRanks | None:
        """A collective party's rank (``geomx.worker.ranks``; the strategies' ``loop.ranks``), else None."""
        return self._tier.ranks

    def _on_message(self, message: Message) -> None:
        if self._tier.handles(message):  # a collective rank's early sum
            return
        if self._handles(message):
            return
        if not self._requests.resolve(message):
            log.warning("[%s] unexpected %s from %r", self._van.name, message.kind.name, message.sender)

    # -- the MXNet-shaped API -----------------------------------------------------------------------------
    def init(self, key: int | Sequence[int], value: torch.Tensor | Sequence[torch.Tensor]) -> None:
        """Declare keys. The master worker's values win: every worker's ``value`` is overwritten with them."""
        pairs = paired("init", key, value)
        keys, values = [k for k, _ in pairs], [v for _, v in pairs]
        started = time.perf_counter()
        try:
            if self._tier.init(keys, values):  # a collective party's ranks: each INITs the slices it owns
                return
            pending = []
            for k, v in zip(keys, values, strict=True):
                info = self._keys.add(k, v)
                data = to_numpy(v, snapshot=True)
                futures = [self._sender.init(k, index, data[start:stop], values=self.is_master_worker)
                           for index, (start, stop) in enumerate(info.slices)]
                pending.append((k, v, info, futures))
            for k, v, info, futures in pending:
                copy_out(self._codecs, self._sender.replies(futures, k, "INIT"), info, v.data)
        finally:
            self.init_s += time.perf_counter() - started

    def push(self, key: int | Sequence[int], value: torch.Tensor | Sequence[torch.Tensor], priority: int = 0,
             tokens: int | None = None) -> None:
        """Send this round's contribution for ``key``; returns at once. Pull to get the round's result.

        The tensor is copied first, so the caller may change it (zero the gradient) right away. ``tokens``: the
        samples (tokens) this worker processed since its last push of ``key``; decoupled HFA rounds weigh each
        party by them (``training.quorum``; a push that reports none counts as 1).
        """
        self._tier.refuse_per_key_api("push")
        if tokens is not None and (not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 0):
            raise ValueError(f"tokens must be a non-negative integer, got {tokens!r}")
        self._push(key, value, priority, snapshot=True, tokens=tokens)

    def _push(self, key: int | Sequence[int], value: torch.Tensor | Sequence[torch.Tensor], priority: int,
              snapshot: bool, tokens: int | None = None, what: str = "push") -> None:
        for k, v, info in checked(self._keys, what, key, value, "values"):  # every key checked before any is sent
            data = to_numpy(v, snapshot=snapshot and not self._route.copies)
            codec = self._sender.codec(self._plugins.lan_codec, v)  # bfloat16: its bits
            self._pending.setdefault(k, []).extend(
                self._sender.push(k, index, data[start:stop], codec, priority, tokens=tokens)
                for index, (start, stop) in enumerate(info.slices))

    def pull(self, key: int | Sequence[int], out: torch.Tensor | Sequence[torch.Tensor], priority: int = 0) -> None:
        """Write the latest value of ``key`` into ``out`` (after a push: that round's result).

        After several pushes of a key (legal, as in MXNet) it waits for every one's answer: the value after them
        all; an earlier push's failure is raised here rather than dropped.
        """
        self._tier.refuse_per_key_api("pull")
        for k, o, info in checked(self._keys, "pull", key, out, "outputs"):
            futures = self._pending.pop(k, None)
            if futures is None:
                self._pull(k, o, "PULL", priority=priority)
                continue
            last = len(futures) - len(info.slices)  # the last push's answers; each earlier push was a round before
            for start in range(0, last, len(info.slices)):  # it: waited for, its failure raised
                self._sender.replies(futures[start:start + len(info.slices)], k, "PUSHPULL")
            self._pull(k, o, "PUSHPULL", futures[last:])

    def pull_job_model(self, key: int | Sequence[int], out: torch.Tensor | Sequence[torch.Tensor]) -> None:
        """Write the job's model of ``key`` into ``out``, as this party's local server holds it, without WAN
        traffic: under HFA the global model of its last global round (streaming: each fragment's last one,
        waiting for an overlapped fragment's answer still on its way; a party's average after a local round is
        not the job's model), elsewhere the tier above's last answer. A pending push is left pending. Usage:
        evaluate the job's model on a copy::

            kv.pull_job_model(list(range(len(params))), [p.data for p in eval_model.parameters()])
        """
        for k, o, _ in checked(self._keys, "pull_job_model", key, out, "outputs"):
            self._pull(k, o, "PULL", held=True)

    def _pull(self, key: int, out: torch.Tensor, what: str, futures: list[Future[Message]] | None = None,
              priority: int = 0, held: bool = False) -> None:
        """``out`` from ``futures`` (a push's answers), or from PULL requests for every slice of ``key``."""
        info = self._keys.check(key, out, "pull")
        if futures is None:
            body = encode_body(PullBody(held=True)) if held else None
            futures = [self._requests.call(self._keys.server_for(key, index),
                                           Message(Kind.PULL, key=key, slice=index, num_slices=len(info.slices),
                                                   priority=priority, body=body))
                       for index in range(len(info.slices))]
        copy_out(self._codecs, self._sender.replies(futures, key, what), info, out.data if out.requires_grad else out)

    def slices(self, key: int) -> list[tuple[int, int, int]]:
        """How ``key`` travels: ``(start, stop, global server index)`` per slice (one message each way per slice).

        ``slice_elems`` (or P3's ``p3_slice_elems``) cuts bigger tensors, spread over the global servers.
        """
        info = self._keys.info(key)
        return [(start, stop, shard) for (start, stop), shard in zip(info.slices, info.shards, strict=True)]

    def ready(self, key: int) -> bool:
        """Whether a pull of ``key`` would return without waiting (every push of it has been answered)."""
        futures = self._pending.get(key)
        return futures is None or all(f.done() for f in futures)

    def pushpull(self, key: int | Sequence[int], value: torch.Tensor | Sequence[torch.Tensor],
                 out: torch.Tensor | Sequence[torch.Tensor] | None = None, priority: int = 0) -> None:
        """Push then pull in one call; ``out`` defaults to ``value`` (in place).

        No copy of ``value`` is made: the call returns only after the server has received it.
        """
        self._tier.refuse_per_key_api("pushpull")
        if out is not None:  # before the push: nothing half-done
            checked(self._keys, "pushpull", key, out, "outputs")
        self._push(key, value, priority, snapshot=False, what="pushpull")
        self.pull(key, value if out is None else out, priority)

    def set_optimizer(self, optimizer: Optimizer) -> None:
        """Install ``optimizer`` on the global servers (master worker only; sent as a name and numbers)."""
        if not self.is_master_worker:
            raise RuntimeError("only the master worker (rank 0 of the central party) may set the optimizer")
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"expected a geomx.optim optimizer, got {type(optimizer).__name__}")
        spec = optimizer.spec()
        if spec["params"].get("rescale_grad") is None:  # what the tier above receives: a sum, or an average
            spec["params"]["rescale_grad"] = self._plugins.rescale_grad
        self._configure(ConfigureBody(optimizer=spec), "set the optimizer")

    def set_gradient_compression(self, spec: dict[str, Any]) -> None:
        """Compress the WAN tier (master worker only), e.g. ``{"type": "bsc", "threshold": 0.01}``.

        Local servers encode what they push, global servers what they answer; the LAN stays dense. Types:
        ``fp16``, ``bsc`` (Bi-Sparse; tensors below ``size_lower_bound`` — MXNET_KVSTORE_SIZE_LOWER_BOUND,
        default 200000 — travel dense), ``mpq`` (fp16 below the bound, Bi-Sparse above), ``int8``,
        ``error_feedback``, ``sparse2bit`` (top-k per chunk in 2 bits, for HFA's deltas). Residual codecs (bsc,
        mpq, sparse2bit) compress both directions without a server optimizer
        (workers step on the pulled aggregate, as in GeoMX's example: use plain SGD, the codec's momentum
        correction is the momentum) and under HFA (the global model's changes come back); a server
        optimizer's weights (MixedSync) come back dense. The fp16 switch for LAN and WAN is the topology's
        ``fp16: true`` (GEOMX_FP16=1).
        """
        if not self.is_master_worker:
            raise RuntimeError("only the master worker (rank 0 of the central party) may set the compression")
        spec, _ = worker_codec(self._codecs, spec, self._topology.size_lower_bound)  # a bad spec fails here
        self._configure(ConfigureBody(compression=spec), "set the compression")

    def _configure(self, body: ConfigureBody | dict[str, Any], what: str) -> None:
        """Send CONFIGURE to every server this worker talks to (a dict is checked as a ConfigureBody first)."""
        typed = decode_body(ConfigureBody, body) if isinstance(body, dict) else body
        futures = [self._requests.call(s, Message(Kind.CONFIGURE, body=encode_body(typed))) for s in self._servers]
        for server, future in zip(self._servers, futures, strict=True):
            self._requests.wait(future, self._timeout, f"{self._requests.names.get(server)} to {what}")

    def assign_local_steps(self, seconds_per_step: float, base_steps: int) -> int:
        """Report this worker's time per local step; returns its local steps for the next round.

        Every worker calls this once per round (it is a synchronous round through the servers). The
        slowest worker gets ``base_steps``, the others as many as fit in the same time. A collective party is one
        worker of ESync (its ranks step together): its rank 0 reports and tells the others their steps.
        """
        assign = functools.partial(self._steps.assign, seconds_per_step, base_steps)
        return self._tier.for_party(assign, "ESync's step assignment")

    def start_step(self, mine: int = 0) -> int:
        """The step the job goes on from, the same on every worker (call once, after ``init``): a resumed global
        server's checkpoint step where it holds the model (an optimizer on the servers), else the master worker's
        ``mine`` (its own checkpoint's step, where the loop keeps the model; 0 on a fresh start).
        Usage: ``for step in range(kv.start_step(), steps):``"""
        told = torch.tensor([float(mine)], dtype=torch.float64)
        self.init(STEP_KEY, told)  # as the PyTorch wrapper does (geomx.torch.checkpoint)
        return int(told.item())

    def barrier(self) -> None:
        """Wait until every worker of every party reaches this barrier."""
        def meet() -> None:  # a collective party meets inside first; its rank 0 speaks for it
            future = self._requests.call(self._servers[0], Message(Kind.BARRIER))
            self._requests.wait(future, self._timeout, "the barrier (all workers of all parties)")

        self._tier.barrier(meet)

    def stats(self) -> dict[str, Any]:
        """Byte counters of this worker and of the servers it talks to (LAN/WAN, sent/received)."""
        result: dict[str, Any] = {"self": self._van.counters.snapshot(), "servers": {}}
        futures = {s: self._requests.call(s, Message(Kind.STATS)) for s in self._servers}
        for server, future in futures.items():
            reply = self._requests.wait(future, self._timeout, f"{self._requests.names.get(server)} STATS")
            result["servers"][self._requests.names.get(server, server)] = reply.body
        return result

    def counters(self) -> dict[str, Any]:
        """This worker's own byte counters, without asking anyone: ``{"lan": {"sent", "recv"}, "wan": {...}}``."""
        return self._van.counters.snapshot()

    def wan_bytes(self) -> int:
        """Bytes that crossed the WAN so far, whole job (every WAN byte passes through a global server)."""
        total = 0
        for body in self.stats()["servers"].values():
            tiers = body.get("upstream", {body.get("name"): body}) if body else {}
            total += sum(t["wan"]["sent"] + t["wan"]["recv"] for t in tiers.values())
        return total

    def record(self, **metrics: Any) -> None:
        """Append a metrics record to the run folder (the launcher's summary shows the last one)."""
        if self.config.run_dir is not None:
            append_metrics(self.config.run_dir, self.name, metrics)

    def close_at_exit(self) -> None:
        """Close when the interpreter exits, as MXNet's kvstore does for loops that never call ``close``; after an
        uncaught exception just disconnect; errors that only say the job failed elsewhere print one line, not a
        traceback (``geomx.worker.exits``: what the hook can and cannot know, and why)."""
        quiet_failures()
        self._exit_hook = LeaveAtExit(self.close, self.name)
        atexit.register(self._exit_hook)

    def close(self, crashed: bool = False) -> None:
        """Leave the job: a shutdown round through the servers, then stop. Safe to call twice.

        ``crashed``: just disconnect (no shutdown round), as after an uncaught exception.
        """
        if self._keys.closed:
            return
        self._keys.closed = True
        if self._exit_hook is not None:
            atexit.unregister(self._exit_hook)
        wait = self._topology.timeouts.shutdown_s
        if crashed:
            self._stats_file.close()
            self._van.stop(flush_timeout=1.0)
            return
        try:
            speaks = self._tier.leaving()  # a collective party's rank 0 says goodbye for the party
            servers = self._servers if speaks else []
            futures = [self._requests.call(s, Message(Kind.SHUTDOWN)) for s in servers]
            for server, future in zip(servers, futures, strict=True):
                self._requests.wait(future, wait, f"{self._requests.names.get(server)} to acknowledge shutdown")
            self._van.send(self._scheduler, Message(Kind.SHUTDOWN))
        finally:
            self._stats_file.close()
            self._van.stop(flush_timeout=wait)
            self._tier.close()

    def __exit__(self, *exc: object) -> None:
        self.close()


def create(kind: str = "dist_sync", config: NodeConfig | None = None, *, close_at_exit: bool = True) -> KVStore:
    """Connect this worker to the job. ``kind``: one of KVSTORE_TYPES; config defaults to the environment.

    ``close_at_exit``: leave the job at the interpreter's exit, as the seeds' loops expect of MXNet's kvstore;
    False: ``close`` (or ``with``) is yours. Ctrl-C while it joins exits 130, a refused join (its party runs
    already), a silent scheduler or a bad setting with one line: no traceback either way, as ``geomx.node``."""
    if kind not in KVSTORE_TYPES:
        raise ValueError(f"unknown kvstore type {kind!r}; valid: {list(KVSTORE_TYPES)}")
    try:
        store = KVStore(kind, config or node_config())
    except KeyboardInterrupt:  # the launcher stopping a job that never started, or the user: nothing to report
        raise SystemExit(130) from None
    except (JoinRefused, ConfigError, TimeoutError) as exc:  # (a refused join, a scheduler that never answered,
        # named with its address, as geomx.node says it; a bad variable or topology: the wrapper's way too)
        raise SystemExit(f"geomx: {exc}") from None
    if close_at_exit:
        store.close_at_exit()
    return store
