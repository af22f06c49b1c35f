"""The whole job (``Topology``) and what one process needs to play its role (``NodeConfig``).

Usage::

    topology = Topology(parties=(PartySpec("dc0", 2),), central="dc0")
    topology.slice_elems          # 1 << 20: one party, no WAN
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .combinations import check
from .errors import ConfigError
from .fields import setting
from .kinds import BOOL, INT
from .specs import (
    CheckpointSpec,
    DGTSpec,
    HFASpec,
    LanTier,
    LinkSpec,
    Mode,
    Outage,
    PartySpec,
    Role,
    SecuritySpec,
    Timeouts,
    TorchRun,
    TrainingSpec,
    TSEngineSpec,
)
from .status import StatusSpec

# Tensors larger than ``slice_elems`` elements travel as independent slices. Left out of the topology, it
# depends on whether the job has a WAN (more than one party):
# - several parties: 256K elements (1 MiB of float32). A 1024x1024 weight is then 4 slices, so the answer to
#   its first slice comes back while its last is still being pushed: a push and its answer share a
#   full-duplex WAN link instead of taking turns (one 1M-element slice made the digits MLP 1.6x slower per
#   step on a 100 Mbit/s link). Not smaller: every slice is one more message for Python to handle on the
#   LAN tier (codecs' size gates look at the whole tensor, so slicing does not change what is compressed);
# - one party (every link a LAN, e.g. the loopback transport bench): 1M elements (GeoMX's
#   MXNET_KVSTORE_BIGARRAY_BOUND), where a message's Python overhead, not the link, sets the pace.
WAN_SLICE_ELEMS = 1 << 18
LAN_SLICE_ELEMS = 1 << 20
AUTO_SLICE_ELEMS = 0  # Topology(slice_elems=0): resolved by default_slice_elems at construction


def default_slice_elems(num_parties: int) -> int:
    """``slice_elems`` when the topology does not say: smaller slices when a WAN joins several parties."""
    return WAN_SLICE_ELEMS if num_parties > 1 else LAN_SLICE_ELEMS


@dataclass(frozen=True)
class Topology:
    """The whole job: parties, global servers, link classes and transport limits."""

    parties: tuple[PartySpec, ...]
    central: str
    num_global_servers: int = setting(1, kind=INT, key="global_servers",
                                      doc="global servers in the central party, the tensors' slices spread over them")
    mode: Mode = Mode.HIPS
    lan: LinkSpec = LinkSpec()
    wan: LinkSpec = LinkSpec()
    timeouts: Timeouts = Timeouts()
    slice_elems: int = AUTO_SLICE_ELEMS  # 0: default_slice_elems(number of parties)
    max_message_bytes: int = setting(1 << 31, kind=INT,
                                     doc="largest message a node accepts, in bytes (a larger one is refused)")
    parties_known: bool = True  # False when built from DMLC_* counts alone: party names are placeholders
    hfa: HFASpec | None = None  # hierarchical frequency aggregation, when enabled
    size_lower_bound: int = setting(200_000, kind=INT, env="GEOMX_SIZE_LOWER_BOUND",
                                    aliases=("MXNET_KVSTORE_SIZE_LOWER_BOUND",),
                                    doc="tensors smaller than this travel dense under Bi-Sparse / MPQ")
    fp16: bool = setting(False, kind=BOOL, env="GEOMX_FP16",
                         doc="kvstore data travels as float16 on LAN and WAN (the model stays float32)")
    early_answers: bool = setting(True, kind=BOOL,
                                  doc="FSA across parties: the last party of a slice gets the others' sum early "
                                      "(geomx.core.early); false only to measure what that saves")
    training: TrainingSpec = TrainingSpec()  # geomx.torch's choices (the kvstore API ignores them)
    security: SecuritySpec = SecuritySpec()  # shared secret / CURVE keys
    checkpoint: CheckpointSpec = CheckpointSpec()  # global servers' checkpoints
    status: StatusSpec = StatusSpec()  # the global scheduler's status page and metrics
    elastic: bool = setting(False, kind=BOOL, env="GEOMX_ELASTIC",
                            doc="FSA: a dead party/worker is dropped and the aggregate rescaled (default: stop)")
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
        if self.size_lower_bound < 0:  # (else every worker's codec refused it, each with a traceback)
            raise ConfigError(f"size_lower_bound must be at least 0, got {self.size_lower_bound}")
        for outage in self.outages:
            if outage.party not in names:
                raise ConfigError(f"outage names party {outage.party!r}, which is not one of the parties {names}")
        if self.slice_elems == AUTO_SLICE_ELEMS:  # frozen: set once, here, before anyone reads it
            object.__setattr__(self, "slice_elems", default_slice_elems(len(self.parties)))
        if self.slice_elems < 1:
            raise ConfigError("slice_elems must be positive")
        check(self.features)

    @property
    def features(self) -> dict[str, bool]:
        """What this topology turns on (its tier shape and feature switches): facts for ``combinations.check``."""
        return {"flat": self.mode is Mode.FLAT, "hfa": self.hfa is not None, "fp16": self.fp16,
                "collective": bool(self.collective_parties),
                "security": self.security.enabled, "dgt": self.dgt is not None, "inter_ts": self.inter_ts,
                "intra_ts": self.intra_ts}

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

    @property
    def collective_parties(self) -> tuple[str, ...]:
        """The parties whose LAN tier is a torch.distributed group (``lan: collective``)."""
        return tuple(p.name for p in self.parties if p.lan is LanTier.COLLECTIVE)

    def is_collective(self, party: str) -> bool:
        """Whether ``party``'s workers form one torch.distributed group and talk to the global servers
        themselves (no local server, no local scheduler)."""
        return self.party(party).lan is LanTier.COLLECTIVE

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
    resume: bool = False  # global servers and workers start from the newest valid checkpoint (`geomx launch --resume`)
    trace: bool = False  # GEOMX_TRACE=1: debug-only message timeline in RUN/trace/ (see geomx.transport.trace)
    torchrun: TorchRun | None = None  # a collective party's rank: torchrun's RANK, WORLD_SIZE ... (else None)

    @property
    def num_workers(self) -> int:
        return self.topology.party(self.party).num_workers

