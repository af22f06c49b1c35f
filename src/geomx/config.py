"""Typed configuration: the only module that reads environment variables and topology files.

Everything else in geomx receives the frozen objects built here. GeoMX's documented variable names
(``DMLC_ROLE``, ``DMLC_PS_ROOT_URI`` ...) are accepted as aliases of our ``GEOMX_*`` names; when both are
set, the ``GEOMX_*`` name wins.

Usage::

    topology = load_topology("topologies/demo.yaml")
    node = node_config_from_env(os.environ)      # inside a process started by `geomx launch`
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A topology file or environment that cannot describe a valid geomx job."""


class Role(enum.StrEnum):
    """What one OS process does in the job."""

    GLOBAL_SCHEDULER = "global_scheduler"
    GLOBAL_SERVER = "global_server"
    LOCAL_SCHEDULER = "local_scheduler"
    LOCAL_SERVER = "local_server"
    WORKER = "worker"


class Mode(enum.StrEnum):
    """HiPS (two tiers, the default) or a flat single-tier parameter server (the baseline)."""

    HIPS = "hips"
    FLAT = "flat"


@dataclass(frozen=True)
class LinkSpec:
    """One link class: bandwidth in bits per second (None = unlimited) and one-way latency in seconds.

    A node sends through one LAN link shared by all its LAN peers (its NIC's outbound side). ``ingress``
    (LAN only): its inbound side too, at the same rate, so many workers sending to one node at once queue
    there (in-cast); off by default.
    """

    bandwidth_bps: float | None = None
    latency_s: float = 0.0
    ingress: bool = False

    @property
    def is_emulated(self) -> bool:
        return self.bandwidth_bps is not None or self.latency_s > 0


@dataclass(frozen=True)
class PartySpec:
    """One data center: its name, how many training workers it runs, and optionally its own WAN link.

    ``wan`` overrides the topology's WAN link for this party's traffic (e.g. one far-away region): the link
    between two parties is the slower of theirs, one pipe per pair and direction. ``access_bps`` is the
    party's own connection to the WAN, shared by *all* its WAN traffic in each direction whatever the other
    party: many parties sending to it at once queue there (in-cast), and what it sends to several parties
    shares it.
    """

    name: str
    num_workers: int
    wan: LinkSpec | None = None
    access_bps: float | None = None


OUTAGE_ORIGINS = ("launch", "training")


@dataclass(frozen=True)
class Outage:
    """A party cut off from the WAN: from ``start_s`` after its origin, for ``duration_s`` seconds.

    Every message between ``party`` and any other party (heartbeats included) is held for the outage, as
    TCP would hold it across a network partition, then sent at the link's rate. ``origin``: ``launch`` (the
    job's start, the default) or ``training`` (each process's first training message, PUSHPULL, sent or
    received: the cut then lands in training however long start-up took). Topology form::

        outages: [{party: dc1, start: 20s, duration: 5s}, {party: dc0, start: 2s, duration: 1s, from: training}]
    """

    party: str
    start_s: float
    duration_s: float
    origin: str = "launch"

    def __post_init__(self) -> None:
        if self.start_s < 0 or self.duration_s <= 0:
            raise ConfigError(f"outage of {self.party!r} needs start >= 0 and duration > 0, "
                              f"got start {self.start_s:g} s, duration {self.duration_s:g} s")
        if self.origin not in OUTAGE_ORIGINS:
            raise ConfigError(f"outage of {self.party!r}: 'from' must be one of {list(OUTAGE_ORIGINS)}, "
                              f"got {self.origin!r}")

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s


@dataclass(frozen=True)
class Timeouts:
    """Every blocking wait in geomx uses one of these (seconds)."""

    register_s: float = 60.0
    request_s: float = 120.0
    round_s: float = 120.0
    shutdown_s: float = 30.0
    heartbeat_s: float = 10.0  # a node silent this long is declared dead by its scheduler
    heartbeat_interval_s: float = 1.0  # how often every node tells its scheduler(s) it is alive

    def __post_init__(self) -> None:
        if not 0 < self.heartbeat_interval_s < self.heartbeat_s:
            raise ConfigError(f"timeouts need 0 < heartbeat_interval ({self.heartbeat_interval_s:g} s) < "
                              f"heartbeat ({self.heartbeat_s:g} s)")


@dataclass(frozen=True)
class HFASpec:
    """Hierarchical frequency aggregation: K1 local steps per local average, K2 local averages per global one."""

    k1: int = 1
    k2: int = 1

    def __post_init__(self) -> None:
        if self.k1 < 1 or self.k2 < 1:
            raise ConfigError(f"HFA needs K1 >= 1 and K2 >= 1, got K1={self.k1}, K2={self.k2}")


@dataclass(frozen=True)
class DGTSpec:
    """Differential Gradient Transmission on local servers' pushes to the global servers (see ``geomx.dgt``).

    Blocks of ``block_bytes`` are ranked by their contribution (an EMA with coefficient ``alpha`` of the mean
    magnitude); the top ``k`` fraction travels on the reliable ZeroMQ channel, the rest on ``channels`` UDP
    channels in falling priority, sharing the reliable traffic's emulated links behind it (paced at ``rate_bps``
    where no link sets a rate). The receiver assembles at ``deadline_s``. ``loss``: the emulated loss rate of
    each UDP channel (seeded by ``seed``). ``adaptive``: K follows ``geomx.dgt.adaptive_k`` of the loss the
    receiver reports (never below ``k_min``; ``k`` until the first reports). ``random_order``: the
    baseline that ranks blocks at random. Usage: ``DGTSpec(channels=3, k=0.8, loss=(0.01, 0.01, 0.01))``.
    """

    channels: int = 3
    k: float = 0.8
    adaptive: bool = False
    k_min: float = 0.2
    block_bytes: int = 4096
    alpha: float = 0.3
    deadline_s: float = 0.05
    loss: tuple[float, ...] = ()
    seed: int = 0
    random_order: bool = False
    rate_bps: float = 400e6

    def __post_init__(self) -> None:
        if not 1 <= self.channels <= 7:
            raise ConfigError(f"dgt.channels (DMLC_UDP_CHANNEL_NUM) must be 1..7, got {self.channels}")
        if not 0.0 < self.k <= 1.0 or not 0.0 < self.k_min <= self.k:
            raise ConfigError(f"dgt needs 0 < k_min <= k <= 1 (DMLC_K, DMLC_K_MIN), got k={self.k}, "
                              f"k_min={self.k_min}")
        if self.block_bytes < 4 or self.block_bytes % 4 or self.block_bytes > 60_000:
            raise ConfigError(f"dgt.block_bytes (DGT_BLOCK_SIZE) must be a multiple of 4 in 4..60000 (one UDP "
                              f"datagram), got {self.block_bytes}")
        if not 0.0 <= self.alpha < 1.0:
            raise ConfigError(f"dgt.alpha (DGT_CONTRIBUTION_ALPHA) must be in [0, 1), got {self.alpha}")
        if self.deadline_s <= 0 or self.rate_bps <= 0:
            raise ConfigError("dgt.deadline and dgt.rate must be positive")
        if len(self.loss) not in (0, 1, self.channels) or not all(0.0 <= x < 1.0 for x in self.loss):
            raise ConfigError(f"dgt.loss needs one rate in [0, 1) or one per channel ({self.channels}), "
                              f"got {list(self.loss)}")

    def loss_of(self, channel: int) -> float:
        """The emulated loss rate of UDP channel ``channel`` (1..channels)."""
        if not self.loss:
            return 0.0
        return self.loss[0] if len(self.loss) == 1 else self.loss[channel - 1]


@dataclass(frozen=True)
class TSEngineSpec:
    """TSEngine's overlays, chosen online, ε-greedy with exploration probability ``1 - max_greed``
    (``MAX_GREED_RATE_TS``); see ``geomx.tsengine``. ``inter`` (``ENABLE_INTER_TS``): between the local
    servers and the global servers, across parties. ``intra`` (``ENABLE_INTRA_TS``): between the workers and
    their local server, inside each party. Usage: ``TSEngineSpec(max_greed=0.9, intra=True)``."""

    max_greed: float = 0.9
    seed: int = 0
    inter: bool = True
    intra: bool = False

    def __post_init__(self) -> None:
        if not 0.0 <= self.max_greed <= 1.0:
            raise ConfigError(f"tsengine.max_greed (MAX_GREED_RATE_TS) must be in [0, 1], got {self.max_greed}")
        if not (self.inter or self.intra):
            raise ConfigError("tsengine: enable 'inter' (ENABLE_INTER_TS), 'intra' (ENABLE_INTRA_TS) or both")


@dataclass(frozen=True)
class SecuritySpec:
    """Who may talk to the job, and whether links are encrypted (see ``geomx.security``).

    ``secret``: a shared secret every connection must present (ZeroMQ PLAIN through a ZAP handler), from
    the topology's ``security.secret`` / ``secret_file`` or GEOMX_SECRET. ``curve_keys``: a folder made by
    ``geomx keygen``; when set, every link is encrypted and authenticated with CURVE instead.
    Usage: ``SecuritySpec(secret="correct horse battery staple")``.
    """

    secret: str | None = field(default=None, repr=False)
    curve_keys: Path | None = None

    def __post_init__(self) -> None:
        if self.secret is not None and len(self.secret) < 8:
            raise ConfigError("the shared secret must be at least 8 characters long")

    @property
    def enabled(self) -> bool:
        return self.secret is not None or self.curve_keys is not None


@dataclass(frozen=True)
class CheckpointSpec:
    """Where and how often global servers save the global model (see ``geomx.checkpoint``).

    A checkpoint is written every ``every_steps`` completed rounds and/or ``every_s`` seconds; the newest
    ``keep`` are kept. Usage: ``CheckpointSpec(dir=Path("ckpt"), every_steps=50)``.
    """

    dir: Path | None = None
    every_steps: int = 0
    every_s: float = 0.0
    keep: int = 3

    def __post_init__(self) -> None:
        if self.every_steps < 0 or self.every_s < 0 or self.keep < 1:
            raise ConfigError(f"checkpoint needs every_steps >= 0, every_seconds >= 0 and keep >= 1, got "
                              f"{self.every_steps}, {self.every_s}, {self.keep}")
        if self.dir is not None and not (self.every_steps or self.every_s):
            raise ConfigError("checkpoint.dir is set: say how often with every_steps and/or every_seconds")


SYNC_KINDS = ("dist_sync", "dist_async")
SERVER_OPTIMIZER_CHOICES = ("auto", "none", "sgd", "adam", "dcasgd", "outer_nesterov")


@dataclass(frozen=True)
class TrainingSpec:
    """How ``geomx.torch.DistributedOptimizer`` runs a training loop: the topology's ``training`` block or env.

    ``sync``: dist_sync (FSA) or dist_async (MixedSync). ``server_optimizer``: ``auto`` runs the wrapped
    torch optimizer on the global servers when it can be translated (SGD, Adam), else averages gradients
    and steps locally; ``none`` always steps locally; a name (``dcasgd``, ``outer_nesterov`` ...) installs
    that server optimizer with ``server_optimizer_params``. ``compression``: a codec spec for the WAN.
    ``esync``: ESync's balanced local steps (needs HFA with K2 = 1). ``p3``: Priority-based Parameter
    Propagation: tensors cut into ``p3_slice_elems`` slices, shallow layers first. ``priorities``: the wrapper
    tags each tensor with ``-layer index`` (shallow layers overtake deep ones in every send queue); ``false``
    sends every tensor at one priority (FIFO in the order sent), to measure what priority alone is worth
    (``geomx bench --only frontend``). ``tensorboard``: the metrics
    records also go to TensorBoard event files (needs ``pip install 'geomx[tensorboard]'``).
    Usage: ``TrainingSpec(sync="dist_async", server_optimizer="dcasgd")``.
    """

    sync: str = "dist_sync"
    server_optimizer: str = "auto"
    server_optimizer_params: tuple[tuple[str, float], ...] = ()
    compression: dict[str, Any] | None = field(default=None, hash=False, compare=True)
    esync: bool = False
    p3: bool = False
    p3_slice_elems: int = 50_000
    priorities: bool = True
    metrics_every: int = 10
    tensorboard: bool = False  # also write the metrics as TensorBoard scalars (RUN/tensorboard/<worker>/)

    def __post_init__(self) -> None:
        if self.sync not in SYNC_KINDS:
            raise ConfigError(f"training.sync {self.sync!r} is unknown; valid: {list(SYNC_KINDS)}")
        if self.server_optimizer not in SERVER_OPTIMIZER_CHOICES:
            raise ConfigError(f"training.server_optimizer {self.server_optimizer!r} is unknown; "
                              f"valid: {list(SERVER_OPTIMIZER_CHOICES)}")
        if self.compression is not None and not isinstance(self.compression.get("type"), str):
            raise ConfigError(f"training.compression needs a 'type', got {self.compression!r}")
        if self.p3_slice_elems < 1:
            raise ConfigError(f"training.p3_slice_elems must be positive, got {self.p3_slice_elems}")
        if self.metrics_every < 1:
            raise ConfigError(f"training.metrics_every must be positive, got {self.metrics_every}")


# Tensors larger than ``slice_elems`` elements travel as independent slices. Left out of the topology, it
# depends on whether the job has a WAN (more than one party):
# - several parties: 256K elements (1 MiB of float32). A 1024x1024 weight is then 4 slices, so the answer to
#   its first slice comes back while its last is still being pushed: a push and its answer share a
#   full-duplex WAN link instead of taking turns (one 1M-element slice made the digits MLP 1.6x slower per
#   step on a 100 Mbit/s link). Not smaller: codecs see slices (Bi-Sparse sends a slice below
#   size_lower_bound, 200000, dense; slices of a tensor of 800K elements or more stay above it), and every
#   slice is one more message for Python to handle on the LAN tier;
# - one party (every link a LAN, e.g. the loopback transport bench): 1M elements (GeoMX's
#   MXNET_KVSTORE_BIGARRAY_BOUND), where a message's Python overhead, not the link, sets the pace.
WAN_SLICE_ELEMS = 1 << 18
LAN_SLICE_ELEMS = 1 << 20
AUTO_SLICE_ELEMS = 0  # Topology(slice_elems=0): resolved by default_slice_elems at construction


def default_slice_elems(num_parties: int) -> int:
    """``slice_elems`` when the topology does not say: smaller slices when a WAN joins several parties."""
    return WAN_SLICE_ELEMS if num_parties > 1 else LAN_SLICE_ELEMS


def _refuse_combinations(feature: str, unsupported: Mapping[str, bool]) -> None:
    """Fail at start when ``feature`` is set together with one it does not combine with (the first present)."""
    for what, present in unsupported.items():
        if present:
            raise ConfigError(f"{feature} does not combine with {what}; see the README's table")


@dataclass(frozen=True)
class Topology:
    """The whole job: parties, global servers, link classes and transport limits."""

    parties: tuple[PartySpec, ...]
    central: str
    num_global_servers: int = 1
    mode: Mode = Mode.HIPS
    lan: LinkSpec = LinkSpec()
    wan: LinkSpec = LinkSpec()
    timeouts: Timeouts = Timeouts()
    slice_elems: int = AUTO_SLICE_ELEMS  # 0: default_slice_elems(number of parties)
    max_message_bytes: int = 1 << 31
    parties_known: bool = True  # False when built from DMLC_* counts alone: party names are placeholders
    hfa: HFASpec | None = None  # hierarchical frequency aggregation, when enabled
    size_lower_bound: int = 200_000  # tensors smaller than this travel dense under Bi-Sparse / MPQ
    fp16: bool = False  # kvstore data travels as float16 on LAN and WAN (the model stays float32)
    # FSA across parties: the last party of a slice gets the others' sum early (geomx.core.early); false only to
    # measure what that saves
    early_answers: bool = True
    training: TrainingSpec = TrainingSpec()  # geomx.torch's choices (the kvstore API ignores them)
    security: SecuritySpec = SecuritySpec()  # shared secret / CURVE keys
    checkpoint: CheckpointSpec = CheckpointSpec()  # global servers' checkpoints
    elastic: bool = False  # FSA: a dead party/worker is dropped and the aggregate rescaled (default: stop)
    dgt: DGTSpec | None = None  # Differential Gradient Transmission, when enabled
    tsengine: TSEngineSpec | None = None  # TSEngine's dissemination overlay across parties, when enabled
    outages: tuple[Outage, ...] = ()  # emulated WAN cut-offs, in seconds from ``job_start``
    job_start: float | None = None  # wall-clock time (time.time()) the outages count from: set by `geomx launch`

    def __post_init__(self) -> None:
        names = [p.name for p in self.parties]
        if not names:
            raise ConfigError("topology has no parties")
        if len(set(names)) != len(names):
            raise ConfigError(f"party names must be unique, got {names}")
        if self.central not in names:
            raise ConfigError(f"central party {self.central!r} is not one of the parties {names}")
        for party in self.parties:
            if party.num_workers < 1:
                raise ConfigError(f"party {party.name!r} needs at least one worker")
            if not re.fullmatch(r"[A-Za-z0-9_.-]+", party.name):
                raise ConfigError(f"party name {party.name!r} may hold only letters, digits, '_', '.', '-'")
        if self.num_global_servers < 1:
            raise ConfigError("num_global_servers must be at least 1")
        for outage in self.outages:
            if outage.party not in names:
                raise ConfigError(f"outage names party {outage.party!r}, which is not one of the parties {names}")
        if self.slice_elems == AUTO_SLICE_ELEMS:  # frozen: set once, here, before anyone reads it
            object.__setattr__(self, "slice_elems", default_slice_elems(len(self.parties)))
        if self.slice_elems < 1:
            raise ConfigError("slice_elems must be positive")
        if self.dgt is not None:
            unsupported = {"a flat parameter server (DGT is for local servers' pushes)": self.mode is Mode.FLAT,
                           "HFA": self.hfa is not None, "the fp16 switch": self.fp16,
                           "security (UDP datagrams are not authenticated)": self.security.enabled}
            _refuse_combinations("DGT (ENABLE_DGT)", unsupported)
        if self.inter_ts:
            unsupported = {"a flat parameter server (there are no local servers to relay)": self.mode is Mode.FLAT,
                           "HFA": self.hfa is not None, "the fp16 switch": self.fp16, "DGT": self.dgt is not None}
            _refuse_combinations("TSEngine (ENABLE_INTER_TS)", unsupported)
        if self.intra_ts:
            unsupported = {"a flat parameter server (there is no local server)": self.mode is Mode.FLAT,
                           "the fp16 switch (relays carry float32)": self.fp16}
            _refuse_combinations("TSEngine inside a party (ENABLE_INTRA_TS)", unsupported)

    @property
    def inter_ts(self) -> bool:
        """TSEngine between local and global servers (ENABLE_INTER_TS)."""
        return self.tsengine is not None and self.tsengine.inter

    @property
    def intra_ts(self) -> bool:
        """TSEngine between workers and their local server (ENABLE_INTRA_TS)."""
        return self.tsengine is not None and self.tsengine.intra

    @property
    def num_all_workers(self) -> int:
        return sum(p.num_workers for p in self.parties)

    def party(self, name: str) -> PartySpec:
        for party in self.parties:
            if party.name == name:
                return party
        raise ConfigError(f"unknown party {name!r}; the topology has {[p.name for p in self.parties]}")

    def wan_between(self, a: str, b: str) -> LinkSpec:
        """The WAN link between parties ``a`` and ``b``: the slower of their links (lowest rate, highest delay)."""
        overrides = {p.name: p.wan for p in self.parties if p.wan is not None}
        specs = [overrides.get(a, self.wan), overrides.get(b, self.wan)]
        rates = [s.bandwidth_bps for s in specs if s.bandwidth_bps is not None]
        return LinkSpec(min(rates) if rates else None, max(s.latency_s for s in specs))

    def access_bps(self, party: str) -> float | None:
        """The rate of ``party``'s own connection to the WAN (None: not limited; see PartySpec)."""
        return next((p.access_bps for p in self.parties if p.name == party), None)

    def worker_offset(self, party: str) -> int:
        """Global rank of the first worker of ``party`` (parties in topology order)."""
        offset = 0
        for spec in self.parties:
            if spec.name == party:
                return offset
            offset += spec.num_workers
        raise ConfigError(f"unknown party {party!r}")


@dataclass(frozen=True)
class NodeConfig:
    """What one process needs to know to play its role."""

    role: Role
    party: str
    topology: Topology
    global_scheduler: str  # "host:port"
    scheduler: str | None = None  # this party's local scheduler, "host:port" (None in flat mode)
    rank: int | None = None  # requested rank (workers: in party; global servers: shard id)
    is_master: bool = False
    bind_host: str = "127.0.0.1"
    bind_port: int = 0  # schedulers bind this port; others take a free one when 0
    run_dir: Path | None = None
    worker_offset: int | None = None  # global rank of this party's first worker; None: from the topology
    resume: bool = False  # global servers start from the newest valid checkpoint (`geomx launch --resume`)
    trace: bool = False  # GEOMX_TRACE=1: debug-only message timeline in RUN/trace/ (see geomx.trace)

    @property
    def num_workers(self) -> int:
        return self.topology.party(self.party).num_workers


# ---------------------------------------------------------------------------------------------------------
# Parsing helpers

_UNITS = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


def _number(text: str, what: str, hint: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"cannot read {what} {text!r}; write it like {hint}") from None


def parse_bandwidth(text: str | float | None) -> float | None:
    """'100Mbit' / '10 Gbit/s' / '1e8' (bits per second) / '12MB' (bytes) / None or 'unlimited' -> bit/s.

    A lower-case ``b`` (or ``bit``, ``bps``) means bits, an upper-case ``B`` (or ``byte``) bytes.
    """
    if text is None:
        return None
    if isinstance(text, (int, float)):
        if text <= 0:
            raise ConfigError(f"bandwidth must be positive, got {text}")
        return float(text)
    cleaned = text.strip().replace(" ", "")
    if cleaned.lower() in ("", "none", "unlimited", "inf"):
        return None
    hint = "'100Mbit' or '10Gbit'"
    match = re.fullmatch(r"([0-9.eE+-]+)([kKmMgGtT]?)(bit|bps|b|B|Bps|byte|bytes)?(/s)?", cleaned)
    if not match:
        raise ConfigError(f"cannot read bandwidth {text!r}; write it like {hint}")
    value = _number(match.group(1), "bandwidth", hint) * _UNITS[match.group(2).lower()]
    if match.group(3) in ("B", "Bps", "byte", "bytes"):
        value *= 8
    if value <= 0:
        raise ConfigError(f"bandwidth must be positive, got {text!r}")
    return value


def parse_duration(text: str | float | None) -> float:
    """'25ms' / '0.5s' / '100us' / 0.025 -> seconds."""
    if text is None:
        return 0.0
    if isinstance(text, (int, float)):
        if text < 0:
            raise ConfigError(f"duration must not be negative, got {text}")
        return float(text)
    hint = "'25ms' or '1.5s'"
    match = re.fullmatch(r"\s*([0-9.e+-]+)\s*(us|ms|s|)\s*", text.lower())
    if not match:
        raise ConfigError(f"cannot read duration {text!r}; write it like {hint}")
    scale = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "": 1.0}[match.group(2)]
    value = _number(match.group(1), "duration", hint) * scale
    if value < 0:
        raise ConfigError(f"duration must not be negative, got {text!r}")
    return value


def _link(raw: Any, where: str, ingress_allowed: bool = False) -> LinkSpec:
    if raw is None:
        return LinkSpec()
    allowed = ["bandwidth", "latency"] + (["ingress"] if ingress_allowed else [])
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where} must be a mapping with {', '.join(repr(a) for a in allowed)}")
    unknown = set(raw) - set(allowed)
    if unknown:
        raise ConfigError(f"{where} has unknown fields {sorted(unknown)}; allowed: {', '.join(allowed)}")
    ingress = raw.get("ingress", False)
    if not isinstance(ingress, bool):
        raise ConfigError(f"{where}.ingress must be true or false, got {ingress!r}")
    bandwidth = parse_bandwidth(raw.get("bandwidth"))
    if ingress and bandwidth is None:
        raise ConfigError(f"{where}.ingress needs a bandwidth (the rate a node receives at)")
    return LinkSpec(bandwidth, parse_duration(raw.get("latency")), ingress)


def _timeouts(raw: Any) -> Timeouts:
    if raw is None:
        return Timeouts()
    if not isinstance(raw, Mapping):
        raise ConfigError("timeouts must be a mapping")
    names = {f.name.removesuffix("_s"): f.name for f in dataclasses.fields(Timeouts)}
    unknown = set(raw) - set(names)
    if unknown:
        raise ConfigError(f"timeouts has unknown fields {sorted(unknown)}; allowed: {sorted(names)}")
    return Timeouts(**{names[k]: parse_duration(v) for k, v in raw.items()})


_TOPOLOGY_FIELDS = {"parties", "central", "global_servers", "mode", "links", "timeouts", "slice_elems",
                    "max_message_bytes", "hfa", "size_lower_bound", "fp16", "early_answers", "training", "security",
                    "checkpoint", "elastic", "dgt", "tsengine", "outages"}


def _outages(raw: Any) -> tuple[Outage, ...]:
    """The topology's ``outages`` list: ``[{party: dc1, start: 20s, duration: 5s}, ...]``."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ConfigError("'outages' must be a list of {party, start, duration}")
    outages = []
    for index, entry in enumerate(raw):
        if not isinstance(entry, Mapping) or not {"party", "start", "duration"} <= set(entry) <= {
                "party", "start", "duration", "from"}:
            raise ConfigError(f"outages[{index}] must be a mapping with exactly 'party', 'start' and 'duration' "
                              f"(and optionally 'from'), got {entry!r}")
        outages.append(Outage(str(entry["party"]), parse_duration(entry["start"]),
                              parse_duration(entry["duration"]), str(entry.get("from", "launch"))))
    return tuple(outages)


def _hfa(raw: Any) -> HFASpec | None:
    if raw is None or raw is False:
        return None
    if not isinstance(raw, Mapping) or set(raw) - {"k1", "k2"}:
        raise ConfigError("'hfa' must be a mapping with 'k1' and 'k2' (integers)")
    values = {k: raw.get(k, 1) for k in ("k1", "k2")}
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"hfa.{name} must be an integer, got {value!r}")
    return HFASpec(**values)


_DGT_FIELDS = {"channels": int, "k": float, "adaptive": bool, "k_min": float, "block_bytes": int, "alpha": float,
               "deadline": float, "loss": tuple, "seed": int, "random_order": bool, "rate": float}


def _dgt(raw: Any, base: DGTSpec | None = None) -> DGTSpec | None:
    """The topology's ``dgt`` block: ``true``, or a mapping of _DGT_FIELDS (durations and rates as text)."""
    if raw is None or raw is False:
        return base
    if raw is True:
        return base or DGTSpec()
    if not isinstance(raw, Mapping) or set(raw) - set(_DGT_FIELDS):
        raise ConfigError(f"'dgt' must be true or a mapping with fields from {sorted(_DGT_FIELDS)}")
    values: dict[str, Any] = {}
    for name, value in raw.items():
        kind = _DGT_FIELDS[name]
        target = {"deadline": "deadline_s", "rate": "rate_bps"}.get(str(name), str(name))
        try:
            if name == "deadline":
                values[target] = parse_duration(value)
            elif name == "rate":
                values[target] = parse_bandwidth(value)
            elif name == "loss":
                items = value.split(",") if isinstance(value, str) else value if isinstance(value, list) else [value]
                values[target] = tuple(float(x) for x in items)
            elif kind is bool:
                values[target] = value if isinstance(value, bool) else str(value).lower() in ("1", "true", "yes", "on")
            else:
                values[target] = kind(value)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"dgt.{name}: cannot read {value!r} ({exc})") from None
    return dataclasses.replace(base or DGTSpec(), **values)


def _named_spec(raw: Any, where: str) -> tuple[str, dict[str, Any]]:
    """``name``, ``name:key=value,key=value``, ``{type: name, key: value}`` or JSON -> (name, params)."""
    if isinstance(raw, str) and raw.strip().startswith("{"):
        try:
            raw = json.loads(raw)
        except ValueError as exc:
            raise ConfigError(f"{where} is not valid JSON: {exc}") from None
    if isinstance(raw, Mapping):
        params = {str(k): v for k, v in raw.items() if k != "type"}
        if not isinstance(raw.get("type"), str):
            raise ConfigError(f"{where} needs a 'type' naming it, got {dict(raw)!r}")
        return str(raw["type"]).lower(), params
    if not isinstance(raw, str) or not raw.strip():
        raise ConfigError(f"{where} must be a name like 'dcasgd' or 'dcasgd:lamda=0.04', got {raw!r}")
    name, _, rest = raw.strip().partition(":")
    params = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"{where}: {item!r} is not key=value")
        params[key.strip()] = yaml.safe_load(value)
    return name.strip().lower(), params


def _training(raw: Any, base: TrainingSpec | None = None) -> TrainingSpec:
    """The ``training`` block of a topology (every field optional)."""
    base = base or TrainingSpec()
    if raw is None:
        return base
    if not isinstance(raw, Mapping):
        raise ConfigError("'training' must be a mapping")
    allowed = {f.name for f in dataclasses.fields(TrainingSpec)} - {"server_optimizer_params"}
    unknown = set(raw) - allowed
    if unknown:
        raise ConfigError(f"training has unknown fields {sorted(unknown)}; allowed: {sorted(allowed)}")
    values: dict[str, Any] = {}
    if "server_optimizer" in raw:
        name, params = _named_spec(raw["server_optimizer"], "training.server_optimizer")
        values["server_optimizer"] = name
        values["server_optimizer_params"] = _numbers(params, "training.server_optimizer")
    if raw.get("compression") is not None:
        name, params = _named_spec(raw["compression"], "training.compression")
        values["compression"] = {"type": name, **params}
    for name in ("sync", "esync", "p3", "p3_slice_elems", "priorities", "metrics_every", "tensorboard"):
        if name in raw:
            value = raw[name]
            expected = {"sync": str, "esync": bool, "p3": bool, "priorities": bool, "tensorboard": bool}.get(name, int)
            if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
                raise ConfigError(f"training.{name} must be {expected.__name__}, got {value!r}")
            values[name] = value
    return dataclasses.replace(base, **values)


def _numbers(params: Mapping[str, Any], where: str) -> tuple[tuple[str, float], ...]:
    out = []
    for key, value in params.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: parameter {key}={value!r} must be a number")
        out.append((key, float(value)))
    return tuple(out)


def _int_field(raw: Mapping[str, Any], name: str, default: int) -> int:
    value = raw.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"topology field {name!r} must be an integer, got {value!r}")
    return value


def _positive_field(raw: Mapping[str, Any], name: str) -> int:
    value = _int_field(raw, name, 1)
    if value < 1:
        raise ConfigError(f"{name} must be positive, got {value}")
    return value


def _bool_field(raw: Mapping[str, Any], name: str, default: bool) -> bool:
    value = raw.get(name, default)
    if not isinstance(value, bool):
        raise ConfigError(f"topology field {name!r} must be true or false, got {value!r}")
    return value


def _path(value: Any, where: str, base_dir: Path | None) -> Path:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where} must be a path, got {value!r}")
    path = Path(value).expanduser()
    return path if path.is_absolute() or base_dir is None else base_dir / path


def _security(raw: Any, base_dir: Path | None) -> SecuritySpec:
    if raw is None:
        return SecuritySpec()
    allowed = {"secret", "secret_file", "curve_keys"}
    if not isinstance(raw, Mapping) or set(raw) - allowed:
        raise ConfigError(f"'security' must be a mapping with some of {sorted(allowed)}")
    if "secret" in raw and "secret_file" in raw:
        raise ConfigError("security: give 'secret' or 'secret_file', not both")
    secret = raw.get("secret")
    if secret is not None and not isinstance(secret, str):
        raise ConfigError("security.secret must be a string")
    if "secret_file" in raw:
        secret = _read_secret(_path(raw["secret_file"], "security.secret_file", base_dir))
    keys = _path(raw["curve_keys"], "security.curve_keys", base_dir) if raw.get("curve_keys") else None
    return SecuritySpec(secret=secret, curve_keys=keys)


def _read_secret(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read the shared secret from {path}: {exc}") from None


def _checkpoint(raw: Any, base_dir: Path | None) -> CheckpointSpec:
    if raw is None:
        return CheckpointSpec()
    allowed = {"dir", "every_steps", "every_seconds", "keep"}
    if not isinstance(raw, Mapping) or set(raw) - allowed:
        raise ConfigError(f"'checkpoint' must be a mapping with some of {sorted(allowed)}")
    for name in ("every_steps", "keep"):
        if name in raw and (isinstance(raw[name], bool) or not isinstance(raw[name], int)):
            raise ConfigError(f"checkpoint.{name} must be an integer, got {raw[name]!r}")
    return CheckpointSpec(dir=_path(raw["dir"], "checkpoint.dir", base_dir) if raw.get("dir") else None,
                          every_steps=raw.get("every_steps", 0),
                          every_s=parse_duration(raw.get("every_seconds", 0)), keep=raw.get("keep", 3))


def topology_from_dict(raw: Mapping[str, Any], base_dir: Path | None = None) -> Topology:
    """Build a Topology from the YAML structure documented in ``topologies/demo.yaml``.

    ``base_dir``: relative paths (checkpoint dir, secret file, CURVE keys) are relative to it.
    """
    if not isinstance(raw, Mapping):
        raise ConfigError("a topology must be a mapping at the top level")
    unknown = set(raw) - _TOPOLOGY_FIELDS
    if unknown:
        raise ConfigError(f"topology has unknown fields {sorted(unknown)}; allowed: {sorted(_TOPOLOGY_FIELDS)}")
    raw_parties = raw.get("parties")
    if not isinstance(raw_parties, Mapping) or not raw_parties:
        raise ConfigError("topology needs 'parties': a mapping of party name to {workers: N}")
    parties = []
    for name, spec in raw_parties.items():
        workers = spec.get("workers") if isinstance(spec, Mapping) else spec
        if not isinstance(workers, int) or isinstance(workers, bool):
            raise ConfigError(f"party {name!r} needs an integer 'workers'")
        fields = {"workers", "wan", "access"}
        if isinstance(spec, Mapping) and set(spec) - fields:
            raise ConfigError(f"party {name!r} has unknown fields {sorted(set(spec) - fields)}; "
                              f"allowed: {', '.join(sorted(fields))}")
        wan = _link(spec.get("wan"), f"parties.{name}.wan") if isinstance(spec, Mapping) and spec.get("wan") else None
        access = parse_bandwidth(spec.get("access")) if isinstance(spec, Mapping) else None
        parties.append(PartySpec(str(name), workers, wan, access))
    links = raw.get("links") or {}
    if not isinstance(links, Mapping) or set(links) - {"lan", "wan"}:
        raise ConfigError("'links' may hold only 'lan' and 'wan'")
    mode_text = str(raw.get("mode", "hips")).lower()
    try:
        mode = Mode(mode_text)
    except ValueError:
        raise ConfigError(f"unknown mode {mode_text!r}; valid: {[m.value for m in Mode]}") from None
    return Topology(
        parties=tuple(parties),
        central=str(raw.get("central", parties[0].name)),
        num_global_servers=_int_field(raw, "global_servers", 1),
        mode=mode,
        lan=_link(links.get("lan"), "links.lan", ingress_allowed=True),
        wan=_link(links.get("wan"), "links.wan"),
        timeouts=_timeouts(raw.get("timeouts")),
        slice_elems=_positive_field(raw, "slice_elems") if "slice_elems" in raw else AUTO_SLICE_ELEMS,
        max_message_bytes=_int_field(raw, "max_message_bytes", 1 << 31),
        hfa=_hfa(raw.get("hfa")),
        size_lower_bound=_int_field(raw, "size_lower_bound", 200_000),
        fp16=_bool_field(raw, "fp16", False),
        early_answers=_bool_field(raw, "early_answers", True),
        training=_training(raw.get("training")),
        security=_security(raw.get("security"), base_dir),
        checkpoint=_checkpoint(raw.get("checkpoint"), base_dir),
        elastic=_bool_field(raw, "elastic", False),
        dgt=_dgt(raw.get("dgt")),
        tsengine=_tsengine(raw.get("tsengine")),
        outages=_outages(raw.get("outages")),
    )


def _tsengine(raw: Any) -> TSEngineSpec | None:
    """The topology's ``tsengine`` block: ``true`` or ``{max_greed: 0.9, seed: 0, inter: true, intra: false}``."""
    if raw is None or raw is False:
        return None
    if raw is True:
        return TSEngineSpec()
    if not isinstance(raw, Mapping) or set(raw) - {"max_greed", "seed", "inter", "intra"}:
        raise ConfigError("'tsengine' must be true or a mapping with 'max_greed', 'seed', 'inter' and/or 'intra'")
    switches = {name: raw.get(name, default) for name, default in (("inter", True), ("intra", False))}
    for name, value in switches.items():
        if not isinstance(value, bool):
            raise ConfigError(f"tsengine.{name} must be true or false, got {value!r}")
    if not any(switches.values()):
        return None
    try:
        return TSEngineSpec(max_greed=float(raw.get("max_greed", 0.9)), seed=int(raw.get("seed", 0)), **switches)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"tsengine: {exc}") from None


def load_topology(path: str | Path) -> Topology:
    """Read a YAML topology file."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read topology file {path}: {exc}") from exc
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"topology file {path} is not valid YAML: {exc}") from exc
    return topology_from_dict(raw, Path(path).resolve().parent)


def topology_to_dict(topology: Topology) -> dict[str, Any]:
    """The inverse of topology_from_dict, for writing a resolved topology next to a run."""

    def link(spec: LinkSpec) -> dict[str, Any]:
        ingress = {"ingress": True} if spec.ingress else {}
        return {"bandwidth": spec.bandwidth_bps, "latency": spec.latency_s, **ingress}

    return {
        "parties": {p.name: {"workers": p.num_workers, **({"wan": link(p.wan)} if p.wan else {}),
                             **({"access": p.access_bps} if p.access_bps is not None else {})}
                    for p in topology.parties},
        "central": topology.central,
        "global_servers": topology.num_global_servers,
        "mode": topology.mode.value,
        "links": {"lan": link(topology.lan), "wan": link(topology.wan)},
        "timeouts": {f.name.removesuffix("_s"): getattr(topology.timeouts, f.name)
                     for f in dataclasses.fields(Timeouts)},
        "slice_elems": topology.slice_elems,
        "max_message_bytes": topology.max_message_bytes,
        **({"hfa": {"k1": topology.hfa.k1, "k2": topology.hfa.k2}} if topology.hfa else {}),
        "size_lower_bound": topology.size_lower_bound,
        "fp16": topology.fp16,
        "early_answers": topology.early_answers,
        "training": _training_to_dict(topology.training),
        # the shared secret is never written out
        **({"security": {"curve_keys": str(topology.security.curve_keys)}} if topology.security.curve_keys else {}),
        **({"checkpoint": {"dir": str(topology.checkpoint.dir), "every_steps": topology.checkpoint.every_steps,
                           "every_seconds": topology.checkpoint.every_s, "keep": topology.checkpoint.keep}}
           if topology.checkpoint.dir else {}),
        **({"elastic": True} if topology.elastic else {}),
        **({"dgt": _dgt_to_dict(topology.dgt)} if topology.dgt else {}),
        **({"tsengine": dataclasses.asdict(topology.tsengine)} if topology.tsengine else {}),
        **({"outages": [{"party": o.party, "start": o.start_s, "duration": o.duration_s, "from": o.origin}
                        for o in topology.outages]}
           if topology.outages else {}),
    }


def _dgt_to_dict(spec: DGTSpec) -> dict[str, Any]:
    return {"channels": spec.channels, "k": spec.k, "adaptive": spec.adaptive, "k_min": spec.k_min,
            "block_bytes": spec.block_bytes, "alpha": spec.alpha, "deadline": spec.deadline_s,
            "loss": list(spec.loss), "seed": spec.seed, "random_order": spec.random_order, "rate": spec.rate_bps}


def _training_to_dict(spec: TrainingSpec) -> dict[str, Any]:
    optimizer = {"type": spec.server_optimizer, **dict(spec.server_optimizer_params)}
    return {"sync": spec.sync, "server_optimizer": optimizer,
            **({"compression": dict(spec.compression)} if spec.compression else {}),
            "esync": spec.esync, "p3": spec.p3, "p3_slice_elems": spec.p3_slice_elems, "priorities": spec.priorities,
            "metrics_every": spec.metrics_every}


# ---------------------------------------------------------------------------------------------------------
# Environment

# Our canonical names, and the GeoMX (ps-lite) names accepted as aliases.
ENV_ALIASES: dict[str, tuple[str, ...]] = {
    "GEOMX_NUM_WORKERS": ("DMLC_NUM_WORKER",),
    "GEOMX_NUM_GLOBAL_SERVERS": ("DMLC_NUM_GLOBAL_SERVER",),
    "GEOMX_NUM_ALL_WORKERS": ("DMLC_NUM_ALL_WORKER",),
    "GEOMX_NUM_PARTIES": ("DMLC_NUM_GLOBAL_WORKER",),
    "GEOMX_MASTER_WORKER": ("DMLC_ROLE_MASTER_WORKER",),
    "GEOMX_HOST": ("DMLC_NODE_HOST",),
    "GEOMX_HFA": ("MXNET_KVSTORE_USE_HFA",),
    "GEOMX_HFA_K1": ("MXNET_KVSTORE_HFA_K1",),
    "GEOMX_HFA_K2": ("MXNET_KVSTORE_HFA_K2",),
    "GEOMX_SIZE_LOWER_BOUND": ("MXNET_KVSTORE_SIZE_LOWER_BOUND",),
    "GEOMX_P3": ("ENABLE_P3",),
    "GEOMX_DGT": ("ENABLE_DGT",),
    "GEOMX_DGT_CHANNELS": ("DMLC_UDP_CHANNEL_NUM",),
    "GEOMX_DGT_K": ("DMLC_K",),
    "GEOMX_DGT_K_MIN": ("DMLC_K_MIN",),
    "GEOMX_DGT_ADAPTIVE": ("ADAPTIVE_K_FLAG",),
    "GEOMX_DGT_BLOCK_BYTES": ("DGT_BLOCK_SIZE",),
    "GEOMX_DGT_ALPHA": ("DGT_CONTRIBUTION_ALPHA",),
    "GEOMX_DGT_RANDOM_ORDER": ("DGT_SET_RANDOM",),
    "GEOMX_INTRA_TS": ("ENABLE_INTRA_TS",),
    "GEOMX_INTER_TS": ("ENABLE_INTER_TS",),
    "GEOMX_MAX_GREED_RATE_TS": ("MAX_GREED_RATE_TS",),
}

_ROLE_NAMES = {r.value for r in Role}


def _get(env: Mapping[str, str], name: str) -> str | None:
    for candidate in (name, *ENV_ALIASES.get(name, ())):
        value = env.get(candidate)
        if value not in (None, ""):
            return value
    return None


def _int(env: Mapping[str, str], name: str) -> int | None:
    value = _get(env, name)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"{name} must be an integer, got {value!r}") from None


def _role_from_env(env: Mapping[str, str]) -> Role:
    role = env.get("GEOMX_ROLE")
    if role:
        if role not in _ROLE_NAMES:
            raise ConfigError(f"GEOMX_ROLE={role!r} is not a role; valid: {sorted(_ROLE_NAMES)}")
        return Role(role)
    dmlc_global = env.get("DMLC_ROLE_GLOBAL", "")
    dmlc_role = env.get("DMLC_ROLE", "")
    if dmlc_global == "global_scheduler":
        return Role.GLOBAL_SCHEDULER
    if dmlc_global == "global_server":
        return Role.GLOBAL_SERVER
    if dmlc_global:
        raise ConfigError(f"DMLC_ROLE_GLOBAL={dmlc_global!r}; valid: global_scheduler, global_server")
    mapping = {"scheduler": Role.LOCAL_SCHEDULER, "server": Role.LOCAL_SERVER, "worker": Role.WORKER}
    if dmlc_role in mapping:
        return mapping[dmlc_role]
    if dmlc_role:
        raise ConfigError(f"DMLC_ROLE={dmlc_role!r}; valid: scheduler, server, worker")
    raise ConfigError("no role: set GEOMX_ROLE (or GeoMX's DMLC_ROLE / DMLC_ROLE_GLOBAL); "
                      "`geomx launch` sets it for you")


def _address(env: Mapping[str, str], canonical: str, uri: str, port: str) -> str | None:
    value, source = env.get(canonical), canonical
    if not value and env.get(uri) and env.get(port):
        value, source = f"{env[uri]}:{env[port]}", f"{uri}:{port}"
    if not value:
        return None
    if not re.fullmatch(r"[^:\s]+:\d{1,5}", value):
        raise ConfigError(f"{source}={value!r} must be HOST:PORT with a numeric port")
    return value


def _topology_from_env(env: Mapping[str, str], role: Role, party: str) -> Topology:
    """A topology for GeoMX-style launches that set only DMLC_* counts (no topology file).

    Only this party's worker count is known; the other parties are placeholders sized so that
    ``num_all_workers`` matches DMLC_NUM_ALL_WORKER. No link emulation.
    """
    num_workers = _int(env, "GEOMX_NUM_WORKERS") or 1
    all_workers = _int(env, "GEOMX_NUM_ALL_WORKERS")
    num_parties = _int(env, "GEOMX_NUM_PARTIES")
    if num_parties is None:  # GeoMX sets DMLC_NUM_GLOBAL_WORKER only on servers and schedulers
        num_parties = 1 if all_workers is None else max(1, -(-all_workers // num_workers))
    if all_workers is None:
        all_workers = num_workers * num_parties
    parties = [PartySpec(party, num_workers)]
    remaining = max(all_workers - num_workers, 0)
    for index in range(1, num_parties):
        share = max(remaining // (num_parties - index), 1)
        remaining -= share
        parties.append(PartySpec(f"{party}-peer{index}", share))
    central = env.get("GEOMX_CENTRAL") or party
    if central not in {p.name for p in parties}:
        central = party
    # GeoMX's slice size, not default_slice_elems: the parties here are guesses that may differ between
    # processes, and every worker must cut every tensor the same way
    return Topology(parties=tuple(parties), central=central, parties_known=False, slice_elems=LAN_SLICE_ELEMS,
                    num_global_servers=_int(env, "GEOMX_NUM_GLOBAL_SERVERS") or 1,
                    timeouts=_timeouts_from_env(env, Timeouts()))


def _hfa_from_env(env: Mapping[str, str], base: HFASpec | None) -> HFASpec | None:
    """GEOMX_HFA / MXNET_KVSTORE_USE_HFA (with _K1, _K2) override the topology's ``hfa``."""
    flag = _get(env, "GEOMX_HFA")
    if flag is None:
        return base
    if flag.lower() in ("0", "false", "no", "off"):
        return None
    if flag.lower() not in ("1", "true", "yes", "on"):
        raise ConfigError(f"GEOMX_HFA / MXNET_KVSTORE_USE_HFA must be 0 or 1, got {flag!r}")
    current = base or HFASpec()
    return HFASpec(k1=_int(env, "GEOMX_HFA_K1") or current.k1, k2=_int(env, "GEOMX_HFA_K2") or current.k2)


_DGT_ENV = {"GEOMX_DGT_CHANNELS": "channels", "GEOMX_DGT_K": "k", "GEOMX_DGT_K_MIN": "k_min",
            "GEOMX_DGT_ADAPTIVE": "adaptive", "GEOMX_DGT_BLOCK_BYTES": "block_bytes", "GEOMX_DGT_ALPHA": "alpha",
            "GEOMX_DGT_DEADLINE": "deadline", "GEOMX_DGT_LOSS": "loss", "GEOMX_DGT_SEED": "seed",
            "GEOMX_DGT_RANDOM_ORDER": "random_order", "GEOMX_DGT_RATE": "rate"}


def _dgt_from_env(env: Mapping[str, str], base: DGTSpec | None) -> DGTSpec | None:
    """GEOMX_DGT / ENABLE_DGT (0, 1 or 2; GeoMX's mode 3 quantizes and is refused) and the GEOMX_DGT_* knobs
    (DMLC_UDP_CHANNEL_NUM, DMLC_K, DMLC_K_MIN, ADAPTIVE_K_FLAG, DGT_BLOCK_SIZE, DGT_CONTRIBUTION_ALPHA,
    DGT_SET_RANDOM) override the topology's ``dgt``."""
    mode = _get(env, "GEOMX_DGT")
    if mode is not None and mode.strip() not in ("0", "1", "2"):
        raise ConfigError(f"GEOMX_DGT / ENABLE_DGT must be 0, 1 or 2 (GeoMX's mode 3, 4-bit quantization of "
                          f"the unreliable blocks, is not supported), got {mode!r}")
    if mode is not None and mode.strip() == "0":
        return None
    overrides = {key: _get(env, name) for name, key in _DGT_ENV.items() if _get(env, name) is not None}
    if mode is None and (base is None or not overrides):
        return base
    return _dgt(overrides or True, base)


def _tsengine_from_env(env: Mapping[str, str], base: TSEngineSpec | None) -> TSEngineSpec | None:
    """GEOMX_INTER_TS / ENABLE_INTER_TS, GEOMX_INTRA_TS / ENABLE_INTRA_TS and GEOMX_MAX_GREED_RATE_TS /
    MAX_GREED_RATE_TS override the topology's ``tsengine``; both switches off turns TSEngine off."""
    inter, intra = _flag(env, "GEOMX_INTER_TS"), _flag(env, "GEOMX_INTRA_TS")
    greed = _get(env, "GEOMX_MAX_GREED_RATE_TS")
    if inter is None and intra is None and (base is None or greed is None):
        return base
    inter = (base.inter if base else False) if inter is None else inter
    intra = (base.intra if base else False) if intra is None else intra
    if not (inter or intra):
        return None
    current = base or TSEngineSpec()
    try:
        max_greed = current.max_greed if greed is None else float(greed)
    except ValueError:
        raise ConfigError(f"GEOMX_MAX_GREED_RATE_TS / MAX_GREED_RATE_TS must be a number, got {greed!r}") from None
    return dataclasses.replace(current, inter=inter, intra=intra, max_greed=max_greed)


def _flag(env: Mapping[str, str], name: str) -> bool | None:
    value = _get(env, name)
    if value is None:
        return None
    if value.lower() in ("0", "false", "no", "off"):
        return False
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    raise ConfigError(f"{name} must be 0 or 1, got {value!r}")


def _training_from_env(env: Mapping[str, str], base: TrainingSpec) -> TrainingSpec:
    """GEOMX_SYNC, GEOMX_SERVER_OPTIMIZER, GEOMX_COMPRESSION, GEOMX_ESYNC, GEOMX_P3 (ENABLE_P3),
    GEOMX_P3_SLICE_ELEMS, GEOMX_PRIORITIES, GEOMX_METRICS_EVERY and GEOMX_TENSORBOARD override the topology's
    ``training`` block."""
    raw: dict[str, Any] = {}
    if _get(env, "GEOMX_SYNC") is not None:
        raw["sync"] = _get(env, "GEOMX_SYNC")
    for name, key in (("GEOMX_SERVER_OPTIMIZER", "server_optimizer"), ("GEOMX_COMPRESSION", "compression")):
        if _get(env, name) is not None:
            raw[key] = _get(env, name)
    for name, key in (("GEOMX_ESYNC", "esync"), ("GEOMX_P3", "p3"), ("GEOMX_PRIORITIES", "priorities"),
                      ("GEOMX_TENSORBOARD", "tensorboard")):
        flag = _flag(env, name)
        if flag is not None:
            raw[key] = flag
    for name, key in (("GEOMX_P3_SLICE_ELEMS", "p3_slice_elems"), ("GEOMX_METRICS_EVERY", "metrics_every")):
        number = _int(env, name)
        if number is not None:
            raw[key] = number
    return _training(raw, base) if raw else base


def _timeouts_from_env(env: Mapping[str, str], base: Timeouts) -> Timeouts:
    changes: dict[str, float] = {}
    value = env.get("GEOMX_TIMEOUT")
    if value:
        seconds = parse_duration(value)
        changes.update(register_s=seconds, request_s=seconds, round_s=seconds)
    for name, attr in (("GEOMX_HEARTBEAT_TIMEOUT", "heartbeat_s"),
                       ("GEOMX_HEARTBEAT_INTERVAL", "heartbeat_interval_s")):
        if env.get(name):
            changes[attr] = parse_duration(env[name])
    return dataclasses.replace(base, **changes) if changes else base


def _security_from_env(env: Mapping[str, str], base: SecuritySpec) -> SecuritySpec:
    """GEOMX_SECRET / GEOMX_SECRET_FILE and GEOMX_CURVE_KEYS override the topology's ``security``."""
    secret = env.get("GEOMX_SECRET") or None
    if env.get("GEOMX_SECRET_FILE") and secret is None:
        secret = _read_secret(Path(env["GEOMX_SECRET_FILE"]))
    keys = Path(env["GEOMX_CURVE_KEYS"]) if env.get("GEOMX_CURVE_KEYS") else None
    if secret is None and keys is None:
        return base
    return SecuritySpec(secret=secret if secret is not None else base.secret, curve_keys=keys or base.curve_keys)


def _checkpoint_from_env(env: Mapping[str, str], base: CheckpointSpec) -> CheckpointSpec:
    """GEOMX_CHECKPOINT_DIR / _EVERY_STEPS / _EVERY_SECONDS override the topology's ``checkpoint``."""
    directory = env.get("GEOMX_CHECKPOINT_DIR")
    steps = _int(env, "GEOMX_CHECKPOINT_EVERY_STEPS")
    seconds = env.get("GEOMX_CHECKPOINT_EVERY_SECONDS")
    if not (directory or steps is not None or seconds):
        return base
    return CheckpointSpec(dir=Path(directory) if directory else base.dir,
                          every_steps=base.every_steps if steps is None else steps,
                          every_s=parse_duration(seconds) if seconds else base.every_s, keep=base.keep)


def node_config_from_env(env: Mapping[str, str]) -> NodeConfig:
    """Build this process's NodeConfig from the environment set by `geomx launch` (or GeoMX scripts)."""
    role = _role_from_env(env)
    party = env.get("GEOMX_PARTY") or env.get("DMLC_PS_ROOT_URI", "dc0").replace(".", "-") or "dc0"
    if env.get("GEOMX_PARTY") is None and env.get("DMLC_PS_ROOT_PORT"):
        party = f"{party}-{env['DMLC_PS_ROOT_PORT']}"
    topology_path = env.get("GEOMX_TOPOLOGY")
    if topology_path:
        topology = load_topology(topology_path)
        topology = dataclasses.replace(topology, timeouts=_timeouts_from_env(env, topology.timeouts))
    else:
        topology = _topology_from_env(env, role, party)
    bound = _int(env, "GEOMX_SIZE_LOWER_BOUND")
    fp16 = _flag(env, "GEOMX_FP16")
    topology = dataclasses.replace(topology, hfa=_hfa_from_env(env, topology.hfa), dgt=_dgt_from_env(env, topology.dgt),
                                   tsengine=_tsengine_from_env(env, topology.tsengine),
                                   size_lower_bound=topology.size_lower_bound if bound is None else bound,
                                   fp16=topology.fp16 if fp16 is None else fp16)
    training = _training_from_env(env, topology.training)
    elastic = _flag(env, "GEOMX_ELASTIC")
    topology = dataclasses.replace(topology, security=_security_from_env(env, topology.security),
                                   checkpoint=_checkpoint_from_env(env, topology.checkpoint),
                                   elastic=topology.elastic if elastic is None else elastic)
    job_start = _get(env, "GEOMX_JOB_START")
    if job_start is not None:
        topology = dataclasses.replace(topology, job_start=_number(job_start, "GEOMX_JOB_START",
                                                                   "seconds since the epoch, as time.time() gives"))
    topology = dataclasses.replace(topology, training=training,
                                   slice_elems=training.p3_slice_elems if training.p3 else topology.slice_elems)
    if role not in (Role.GLOBAL_SCHEDULER,) and party not in {p.name for p in topology.parties}:
        raise ConfigError(f"GEOMX_PARTY={party!r} is not a party of the topology "
                          f"{[p.name for p in topology.parties]}")
    global_scheduler = _address(env, "GEOMX_GLOBAL_SCHEDULER", "DMLC_PS_GLOBAL_ROOT_URI",
                                "DMLC_PS_GLOBAL_ROOT_PORT")
    scheduler = _address(env, "GEOMX_SCHEDULER", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT")
    if global_scheduler is None:
        raise ConfigError("no global scheduler address: set GEOMX_GLOBAL_SCHEDULER=HOST:PORT "
                          "(or DMLC_PS_GLOBAL_ROOT_URI and DMLC_PS_GLOBAL_ROOT_PORT)")
    needs_local = role in (Role.LOCAL_SCHEDULER, Role.LOCAL_SERVER) or (
        role is Role.WORKER and topology.mode is Mode.HIPS)
    if needs_local and scheduler is None:
        raise ConfigError(f"role {role.value} needs its party's scheduler: set GEOMX_SCHEDULER=HOST:PORT "
                          "(or DMLC_PS_ROOT_URI and DMLC_PS_ROOT_PORT)")
    bind_port = 0
    if role is Role.GLOBAL_SCHEDULER:
        bind_port = int(global_scheduler.rsplit(":", 1)[1])
    elif role is Role.LOCAL_SCHEDULER and scheduler is not None:
        bind_port = int(scheduler.rsplit(":", 1)[1])
    run_dir = env.get("GEOMX_RUN_DIR")
    master_flag = _get(env, "GEOMX_MASTER_WORKER")
    return NodeConfig(
        role=role,
        party=party,
        topology=topology,
        global_scheduler=global_scheduler,
        scheduler=scheduler,
        rank=_int(env, "GEOMX_RANK"),
        is_master=master_flag not in (None, "0", "false", "False"),
        bind_host=_get(env, "GEOMX_HOST") or "127.0.0.1",
        bind_port=bind_port,
        run_dir=Path(run_dir) if run_dir else None,
        worker_offset=_int(env, "GEOMX_WORKER_OFFSET"),
        resume=env.get("GEOMX_RESUME", "") not in ("", "0", "false", "False"),
        trace=env.get("GEOMX_TRACE", "") not in ("", "0", "false", "False"),
    )


def node_config() -> NodeConfig:
    """This process's NodeConfig, read from ``os.environ``."""
    return node_config_from_env(os.environ)


def node_env(node: NodeConfig, topology_path: Path) -> dict[str, str]:
    """The environment variables that make ``node_config_from_env`` rebuild ``node`` (used by the launcher)."""
    env = {
        "GEOMX_ROLE": node.role.value,
        "GEOMX_PARTY": node.party,
        "GEOMX_TOPOLOGY": str(topology_path),
        "GEOMX_GLOBAL_SCHEDULER": node.global_scheduler,
        "GEOMX_HOST": node.bind_host,
    }
    if node.scheduler:
        env["GEOMX_SCHEDULER"] = node.scheduler
    if node.rank is not None:
        env["GEOMX_RANK"] = str(node.rank)
    if node.is_master:
        env["GEOMX_MASTER_WORKER"] = "1"
    if node.run_dir is not None:
        env["GEOMX_RUN_DIR"] = str(node.run_dir)
    if node.resume:
        env["GEOMX_RESUME"] = "1"
    if node.topology.job_start is not None:
        env["GEOMX_JOB_START"] = repr(node.topology.job_start)
    return env
