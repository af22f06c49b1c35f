"""The typed, frozen specs of one job: links, parties, outages, timeouts and each feature's settings.

Every other geomx module receives these objects; nothing here reads a file or the environment.

Usage::

    spec = DGTSpec(channels=3, k=0.8, loss=(0.01, 0.01, 0.01))
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from .errors import ConfigError
from .fields import Switch, extras, filled_by, origins, setting
from .kinds import BANDWIDTH, BOOL, CODEC, DURATION, FLOAT, FLOATS, INT, OPTIMIZER, PATH, STR


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


class LanTier(enum.StrEnum):
    """How a party's workers meet inside the data center: through its local server (HiPS, GeoMX's tier, the
    default) or as one torch.distributed group whose ranks each sync their own slices across the WAN."""

    SERVER = "server"
    COLLECTIVE = "collective"


@dataclass(frozen=True)
class TorchRun:
    """Where a rank of a collective party stands in its party's group, as torchrun's variables say (``RANK``,
    ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``)."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ConfigError(f"RANK={self.rank} is not in WORLD_SIZE={self.world_size}")
        if not 0 < self.master_port < 65536:
            raise ConfigError(f"MASTER_PORT={self.master_port} is not a port")


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
    shares it. ``lan``: the party's LAN tier (``LanTier``): its local server, or a collective group.
    """

    name: str
    num_workers: int
    wan: LinkSpec | None = None
    access_bps: float | None = None
    lan: LanTier = LanTier.SERVER


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

    register_s: float = setting(60.0, kind=DURATION, key="register", env="GEOMX_TIMEOUT",
                                doc="waiting for every process to join")
    request_s: float = setting(120.0, kind=DURATION, key="request", env="GEOMX_TIMEOUT",
                               doc="a worker waiting for an answer")
    round_s: float = setting(120.0, kind=DURATION, key="round", env="GEOMX_TIMEOUT",
                             doc="a server waiting for all its clients")
    shutdown_s: float = setting(30.0, kind=DURATION, key="shutdown",
                                doc="a leaving node flushing its last messages and checkpoint writes")
    heartbeat_s: float = setting(10.0, kind=DURATION, key="heartbeat", env="GEOMX_HEARTBEAT_TIMEOUT",
                                 doc="a node silent this long is declared dead by its scheduler")
    heartbeat_interval_s: float = setting(1.0, kind=DURATION, key="heartbeat_interval", env="GEOMX_HEARTBEAT_INTERVAL",
                                          doc="how often every node tells its scheduler(s) it is alive")

    def __post_init__(self) -> None:
        if not 0 < self.heartbeat_interval_s < self.heartbeat_s:
            raise ConfigError(f"timeouts need 0 < heartbeat_interval ({self.heartbeat_interval_s:g} s) < "
                              f"heartbeat ({self.heartbeat_s:g} s)")


@dataclass(frozen=True)
class HFASpec:
    """Hierarchical frequency aggregation: K1 local steps per local average, K2 local averages per global one."""

    switch: ClassVar[Switch] = Switch("GEOMX_HFA", ("MXNET_KVSTORE_USE_HFA",),
                                      doc="`1` / `0`: HFA on or off, whatever the topology says")
    k1: int = setting(1, kind=INT, env="GEOMX_HFA_K1", aliases=("MXNET_KVSTORE_HFA_K1",),
                      doc="local steps per local model average")
    k2: int = setting(1, kind=INT, env="GEOMX_HFA_K2", aliases=("MXNET_KVSTORE_HFA_K2",),
                      doc="local averages per global one")

    def __post_init__(self) -> None:
        if self.k1 < 1 or self.k2 < 1:
            raise ConfigError(f"HFA needs K1 >= 1 and K2 >= 1, got K1={self.k1}, K2={self.k2}")


@dataclass(frozen=True)
class DGTSpec:
    """Differential Gradient Transmission on local servers' pushes to the global servers (``geomx.algorithms.dgt``).

    Blocks of ``block_bytes`` are ranked by their contribution (an EMA with coefficient ``alpha`` of the mean
    magnitude); the top ``k`` fraction travels on the reliable ZeroMQ channel, the rest on ``channels`` UDP
    channels in falling priority, sharing the reliable traffic's emulated links behind it (paced at ``rate_bps``
    where no link sets a rate). The receiver assembles at ``deadline_s``. ``loss``: the emulated loss rate of
    each UDP channel (seeded by ``seed``). ``adaptive``: K follows ``dgt.datagrams.adaptive_k`` of the loss the
    receiver reports (never below ``k_min``; ``k`` until the first reports). ``random_order``: the
    baseline that ranks blocks at random. Usage: ``DGTSpec(channels=3, k=0.8, loss=(0.01, 0.01, 0.01))``.
    """

    # GeoMX's mode 1 and 2 both turn DGT on here; its mode 3 is refused with this text
    switch: ClassVar[Switch] = Switch(
        "GEOMX_DGT", ("ENABLE_DGT",), on=("1", "2"), off=("0",),
        expects="0, 1 or 2 (GeoMX's mode 3, 4-bit quantization of the unreliable blocks, is not supported)",
        doc="`1` or `2`: DGT on; `0`: off, whatever the topology says (GeoMX's `3`, 4-bit quantization, is refused)")

    channels: int = setting(3, kind=INT, env="GEOMX_DGT_CHANNELS", aliases=("DMLC_UDP_CHANNEL_NUM",),
                            doc="UDP channels (1..7) for the blocks outside the top K, in falling priority")
    k: float = setting(0.8, kind=FLOAT, env="GEOMX_DGT_K", aliases=("DMLC_K",),
                       doc="fraction of the blocks, by contribution, sent on the reliable channel (0 < K <= 1)")
    adaptive: bool = setting(False, kind=BOOL, env="GEOMX_DGT_ADAPTIVE", aliases=("ADAPTIVE_K_FLAG",),
                             doc="K follows the loss the receiver reports (never below k_min)")
    k_min: float = setting(0.2, kind=FLOAT, env="GEOMX_DGT_K_MIN", aliases=("DMLC_K_MIN",),
                           doc="the smallest K adaptive may choose (0 < k_min <= K)")
    block_bytes: int = setting(4096, kind=INT, env="GEOMX_DGT_BLOCK_BYTES", aliases=("DGT_BLOCK_SIZE",),
                               doc="bytes per block: a multiple of 4, at most 60000 (one UDP datagram)")
    alpha: float = setting(0.3, kind=FLOAT, env="GEOMX_DGT_ALPHA", aliases=("DGT_CONTRIBUTION_ALPHA",),
                           doc="weight of the previous rounds in a block's contribution (an EMA), in [0, 1)")
    deadline_s: float = setting(0.05, kind=DURATION, key="deadline", env="GEOMX_DGT_DEADLINE",
                                doc="the receiver assembles a push this long after its reliable part (lost blocks: 0)")
    loss: tuple[float, ...] = setting((), kind=FLOATS, env="GEOMX_DGT_LOSS",
                                      doc="emulated loss rate in [0, 1): one for every UDP channel, or one per channel")
    seed: int = setting(0, kind=INT, env="GEOMX_DGT_SEED", doc="seed of the emulated loss and of random_order")
    random_order: bool = setting(False, kind=BOOL, env="GEOMX_DGT_RANDOM_ORDER", aliases=("DGT_SET_RANDOM",),
                                 doc="rank the blocks at random instead of by contribution (the baseline)")
    rate_bps: float = setting(400e6, kind=BANDWIDTH, key="rate", env="GEOMX_DGT_RATE",
                              doc="the UDP blocks' pace, in bits per second, where no emulated link sets a rate")

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
    (``MAX_GREED_RATE_TS``); see ``geomx.algorithms.tsengine.rules``. ``inter`` (``ENABLE_INTER_TS``): between the local
    servers and the global servers, across parties. ``intra`` (``ENABLE_INTRA_TS``): between the workers and
    their local server, inside each party. Usage: ``TSEngineSpec(max_greed=0.9, intra=True)``."""

    # no variable of its own: the two overlays' flags switch the block (both off: no TSEngine)
    switch: ClassVar[Switch] = Switch(flags=("inter", "intra"))

    max_greed: float = setting(0.9, kind=FLOAT, env="GEOMX_MAX_GREED_RATE_TS", aliases=("MAX_GREED_RATE_TS",),
                               doc="probability in [0, 1] of taking the best measured link (else a random one)")
    seed: int = setting(0, kind=INT, doc="seed of the ε-greedy choices")
    inter: bool = setting(True, kind=BOOL, env="GEOMX_INTER_TS", aliases=("ENABLE_INTER_TS",),
                          doc="overlay between the local servers and the global servers, across parties")
    intra: bool = setting(False, kind=BOOL, env="GEOMX_INTRA_TS", aliases=("ENABLE_INTRA_TS",),
                          doc="overlay between the workers and their local server, inside each party")

    def __post_init__(self) -> None:
        if not 0.0 <= self.max_greed <= 1.0:
            raise ConfigError(f"tsengine.max_greed (MAX_GREED_RATE_TS) must be in [0, 1], got {self.max_greed}")
        if not (self.inter or self.intra):
            raise ConfigError("tsengine: enable 'inter' (ENABLE_INTER_TS), 'intra' (ENABLE_INTRA_TS) or both")


@dataclass(frozen=True)
class SecuritySpec:
    """Who may talk to the job, and whether links are encrypted (see ``geomx.transport.security``).

    ``secret``: a shared secret every connection must present (ZeroMQ PLAIN through a ZAP handler), from
    the topology's ``security.secret`` / ``secret_file`` or GEOMX_SECRET / GEOMX_SECRET_FILE. ``curve_keys``: a
    folder made by ``geomx keygen``; when set, every link is encrypted and authenticated with CURVE instead.
    Usage: ``SecuritySpec(secret="correct horse battery staple")``.
    """

    secret: str | None = setting(None, kind=STR, env="GEOMX_SECRET", file_env="GEOMX_SECRET_FILE", written=False,
                                 repr=False, doc="shared secret (at least 8 characters) every connection presents; "
                                                 "the file's text stands for it; never written out")
    curve_keys: Path | None = setting(None, kind=PATH, env="GEOMX_CURVE_KEYS",
                                      doc="folder of keys made by `geomx keygen`: every link encrypted (CURVE)")

    def __post_init__(self) -> None:
        if self.secret is not None and len(self.secret) < 8:
            raise ConfigError("the shared secret must be at least 8 characters long")

    @property
    def enabled(self) -> bool:
        return self.secret is not None or self.curve_keys is not None


@dataclass(frozen=True)
class CheckpointSpec:
    """Where and how often global servers save the global model (see ``geomx.runs.checkpoint``).

    A checkpoint is written every ``every_steps`` completed rounds and/or ``every_seconds`` seconds (the field
    ``every_s``); the newest ``keep`` are kept. Usage: ``CheckpointSpec(dir=Path("ckpt"), every_steps=50)``.
    """

    dir: Path | None = setting(None, kind=PATH, env="GEOMX_CHECKPOINT_DIR",
                               doc="folder the global servers write checkpoints to (unset: no checkpoints)")
    every_steps: int = setting(0, kind=INT, env="GEOMX_CHECKPOINT_EVERY_STEPS",
                               doc="a checkpoint every this many completed rounds (0: not by rounds)")
    every_s: float = setting(0.0, kind=DURATION, key="every_seconds", env="GEOMX_CHECKPOINT_EVERY_SECONDS",
                             doc="a checkpoint at the first round this long after the last (0: not by time)")
    keep: int = setting(3, kind=INT, doc="how many of the newest checkpoints are kept")

    def __post_init__(self) -> None:
        if self.every_steps < 0 or self.every_s < 0 or self.keep < 1:
            raise ConfigError(f"checkpoint needs every_steps >= 0, every_seconds >= 0 and keep >= 1, got "
                              f"{self.every_steps}, {self.every_s}, {self.keep}")
        if self.dir is not None and not (self.every_steps or self.every_s):
            raise ConfigError("checkpoint.dir is set: say how often with every_steps and/or every_seconds")


# Names in a training block: the registries (algorithms, optim) say which exist (algorithms.registry.check_names).
_NAME = re.compile(r"[a-z0-9_]+")


@dataclass(frozen=True)
class TrainingSpec:
    """How ``geomx.torch.DistributedOptimizer`` runs a training loop: the topology's ``training`` block or env.

    ``sync``: a sync policy's name (dist_sync: FSA, dist_async: MixedSync, dist_ssp: SSP;
    ``geomx.algorithms.registry`` has them all, ``geomx.server.compose.check_plugins`` checks it and the plug-in
    options). ``server_optimizer``: ``auto`` steps the wrapped torch optimizer on every worker on the mean
    gradient under FSA (as DDP), and translates it onto the global servers (SGD, Adam) where the sync policy
    needs a server optimizer (MixedSync, SSP) or P3 is on (its overlap lands new weights lazily); ``none``
    always steps on the workers; ``translate`` always runs the translated optimizer on the global servers; a
    name (``dcasgd``, ``outer_nesterov`` ...) installs that server optimizer with ``server_optimizer_params``
    (written ``name:key=value,...`` or ``{type: name, key: value}``; ``type`` is the name's place, so no parameter
    may be called that). ``compression``: a codec spec for the WAN.
    ``esync``: ESync's balanced local steps (needs HFA with K2 = 1). ``p3``: Priority-based Parameter
    Propagation: tensors cut into ``p3_slice_elems`` slices, shallow layers first. ``priorities``: the wrapper
    tags each tensor with ``-layer index`` (shallow layers overtake deep ones in every send queue); ``false``
    sends every tensor at one priority (FIFO in the order sent), to measure what priority alone is worth
    (``geomx bench --only frontend``). ``tensorboard``: the metrics
    records also go to TensorBoard event files (needs ``pip install 'geomx[tensorboard]'``).
    Usage: ``TrainingSpec(sync="dist_async", server_optimizer="dcasgd")``.
    """

    sync: str = setting("dist_sync", kind=STR, expects="str", env="GEOMX_SYNC",
                        doc="sync policy: dist_sync (FSA), dist_async (MixedSync), dist_ssp (SSP) or a plug-in's")
    server_optimizer: str = setting("auto", kind=OPTIMIZER, env="GEOMX_SERVER_OPTIMIZER",
                                    companions=("server_optimizer_params",),
                                    doc="auto, none, translate or a server optimizer with its parameters (above)")
    server_optimizer_params: tuple[tuple[str, float], ...] = filled_by((), of="server_optimizer")
    compression: dict[str, Any] | None = setting(None, kind=CODEC, env="GEOMX_COMPRESSION", hash=False,
                                                 compare=True, doc="codec of the WAN traffic (unset: none)")
    esync: bool = setting(False, kind=BOOL, expects="bool", env="GEOMX_ESYNC",
                          doc="ESync's balanced local steps per worker (needs HFA with K2 = 1)")
    p3: bool = setting(False, kind=BOOL, expects="bool", env="GEOMX_P3", aliases=("ENABLE_P3",),
                       doc="Priority-based Parameter Propagation: small slices, shallow layers first")
    p3_slice_elems: int = setting(50_000, kind=INT, expects="int", env="GEOMX_P3_SLICE_ELEMS",
                                  doc="P3's slice size, in elements (stands for slice_elems when p3 is on)")
    priorities: bool = setting(True, kind=BOOL, expects="bool", env="GEOMX_PRIORITIES",
                               doc="shallow layers overtake deep ones in every send queue; false: FIFO")
    metrics_every: int = setting(10, kind=INT, expects="int", env="GEOMX_METRICS_EVERY",
                                 doc="a metrics record every this many training steps")
    tensorboard: bool = setting(False, kind=BOOL, expects="bool", env="GEOMX_TENSORBOARD",
                                doc="also write the metrics as TensorBoard scalars (RUN/tensorboard/<worker>/)")
    bucket_mb: float = setting(25.0, kind=FLOAT, expects="number", env="GEOMX_BUCKET_MB",
                               doc="a collective party's gradient buckets, in MB (as DDP's bucket_cap_mb): each "
                                   "is reduce-scattered as soon as backward has filled it")
    staged: bool = setting(False, kind=BOOL, expects="bool", env="GEOMX_STAGED",
                           doc="a collective rank's global rounds through host buffers apart from the model (the "
                               "GPU's shape of the path, on the CPU; a CUDA model always stages)")
    # Plug-in options: keys of the ``training`` block no field above declares and GEOMX_<NAME> variables nothing
    # reads, as (name, text) pairs. The composition root (geomx.server.compose) hands each plug-in the ones it declares
    # and refuses the rest; this model knows none of them.
    plugin_options: tuple[tuple[str, str], ...] = extras()
    # which of the above the environment gave, (key, variable, text): refusals name the variable (fields.named)
    env_origins: tuple[tuple[str, str, str | None], ...] = origins()

    @property
    def bucket_bytes(self) -> int:
        """``bucket_mb`` in bytes (at least 1): the size the collective strategies cut their gradient buckets to."""
        return max(1, int(self.bucket_mb * (1 << 20)))

    def __post_init__(self) -> None:
        # one order (a YAML writer sorts keys): equal parameters make equal specs
        object.__setattr__(self, "server_optimizer_params", tuple(sorted(self.server_optimizer_params)))
        if not self.bucket_mb > 0:
            raise ConfigError(f"training.bucket_mb must be positive, got {self.bucket_mb}")
        for name in ("sync", "server_optimizer"):
            if not _NAME.fullmatch(getattr(self, name)):
                raise ConfigError(f"training.{name} must be a name in lower case letters, digits and '_', got "
                                  f"{getattr(self, name)!r}")
        if any(key == "type" for key, _ in self.server_optimizer_params):
            raise ConfigError("training.server_optimizer_params: 'type' names the optimizer "
                              f"({self.server_optimizer!r}); no parameter may be called that")
        if self.compression is not None and not isinstance(self.compression.get("type"), str):
            raise ConfigError(f"training.compression needs a 'type', got {self.compression!r}")
        if self.p3_slice_elems < 1:
            raise ConfigError(f"training.p3_slice_elems must be positive, got {self.p3_slice_elems}")
        if self.metrics_every < 1:
            raise ConfigError(f"training.metrics_every must be positive, got {self.metrics_every}")

