"""The environment: ``GEOMX_*`` variables (and GeoMX's documented names as aliases) -> ``NodeConfig``, and back.

GeoMX's documented variable names (``DMLC_ROLE``, ``DMLC_PS_ROOT_URI`` ...) are accepted as aliases of our
``GEOMX_*`` names; when both are set, the ``GEOMX_*`` name wins.

Usage::

    node = node_config_from_env(os.environ)      # inside a process started by `geomx launch`
    env = node_env(node, run_dir / "topology.yaml")
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .fields import aliases_of, block_from_env, env_origins, env_values, lookup, lookup_named, replaced, variables
from .kinds import BOOL
from .specs import (
    CheckpointSpec,
    DGTSpec,
    HFASpec,
    LanTier,
    Mode,
    PartySpec,
    Role,
    SecuritySpec,
    Timeouts,
    TorchRun,
    TrainingSpec,
    TSEngineSpec,
)
from .status import StatusSpec
from .topology import LAN_SLICE_ELEMS, NodeConfig, Topology
from .units import parse_number
from .yaml_io import load_topology

# Our canonical names, and the GeoMX (ps-lite) names accepted as aliases: the process-level names here, every
# feature's (and every block switch's) from its spec's declarations (geomx.config.fields).
_NODE_ALIASES: dict[str, tuple[str, ...]] = {
    "GEOMX_NUM_WORKERS": ("DMLC_NUM_WORKER",),
    "GEOMX_NUM_GLOBAL_SERVERS": ("DMLC_NUM_GLOBAL_SERVER",),
    "GEOMX_NUM_ALL_WORKERS": ("DMLC_NUM_ALL_WORKER",),
    "GEOMX_NUM_PARTIES": ("DMLC_NUM_GLOBAL_WORKER",),
    "GEOMX_MASTER_WORKER": ("DMLC_ROLE_MASTER_WORKER",),
    "GEOMX_HOST": ("DMLC_NODE_HOST",),
}
# The variables read by hand here: a process's role, party and addresses, the counts of a job without a topology
# file, its run folder, resume, the job's start and tracing. Every other one is declared on its spec: a field's
# (``setting``) or an optional block's switch (``Switch``: GEOMX_HFA, GEOMX_DGT).
NODE_VARIABLES = ("GEOMX_ROLE", "GEOMX_PARTY", "GEOMX_TOPOLOGY", "GEOMX_SCHEDULER", "GEOMX_GLOBAL_SCHEDULER",
                  "GEOMX_NUM_WORKERS", "GEOMX_NUM_GLOBAL_SERVERS", "GEOMX_NUM_ALL_WORKERS", "GEOMX_NUM_PARTIES",
                  "GEOMX_CENTRAL", "GEOMX_MASTER_WORKER", "GEOMX_RANK", "GEOMX_HOST", "GEOMX_WORKER_OFFSET",
                  "GEOMX_RUN_DIR", "GEOMX_RESUME", "GEOMX_JOB_START", "GEOMX_TRACE", "GEOMX_LAN")
# torchrun's variables: a collective party's rank reads them (torch.distributed's own names, no GEOMX_ prefix)
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
# every spec whose declarations the environment may set
ENV_SPECS: tuple[type, ...] = (Topology, Timeouts, HFASpec, DGTSpec, TSEngineSpec, TrainingSpec, SecuritySpec,
                               CheckpointSpec, StatusSpec)
# the topology's optional blocks, switched on and off by their spec's ``switch`` (fields.block_from_env)
OPTIONAL_BLOCKS: tuple[tuple[str, type], ...] = (("hfa", HFASpec), ("dgt", DGTSpec), ("tsengine", TSEngineSpec))
ENV_ALIASES: dict[str, tuple[str, ...]] = {**_NODE_ALIASES, **aliases_of(*ENV_SPECS)}

_ROLE_NAMES = {r.value for r in Role}


def _get(env: Mapping[str, str], name: str) -> str | None:
    return lookup(env, name, ENV_ALIASES.get(name, ()))


def _named_int(env: Mapping[str, str], name: str) -> tuple[str, int] | None:
    """(the variable set, its integer) for ``name`` or its alias; a bad one is refused naming the variable set
    (DMLC_NUM_WORKER), not our name for it."""
    found = lookup_named(env, name, ENV_ALIASES.get(name, ()))
    if found is None:
        return None
    try:
        return found[0], int(found[1])
    except ValueError:
        raise ConfigError(f"{found[0]} must be an integer, got {found[1]!r}") from None


def _int(env: Mapping[str, str], name: str) -> int | None:
    """``name``'s integer (or its alias's), None where neither is set (``_named_int``)."""
    found = _named_int(env, name)
    return None if found is None else found[1]


def _count(env: Mapping[str, str], name: str) -> int | None:
    """``name``'s count of processes (or its alias's): at least 1, else refused naming the variable set, where
    ``or 1`` would read GeoMX's ``DMLC_NUM_WORKER=0`` as one worker and a negative count as none."""
    found = _named_int(env, name)
    if found is not None and found[1] < 1:
        raise ConfigError(f"{found[0]} must be at least 1, got {found[1]}")
    return None if found is None else found[1]


def _flag(env: Mapping[str, str], name: str) -> bool:
    """``name``'s switch (or its alias's), 0 or 1 as every other one reads (``DMLC_ROLE_MASTER_WORKER=maybe`` is
    refused naming it, not taken for yes); unset: off."""
    found = lookup_named(env, name, ENV_ALIASES.get(name, ()))
    return False if found is None else bool(BOOL.from_text(found[1], found[0]))


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
    if env.get("RANK") and env.get("GEOMX_PARTY"):  # a collective party's rank started by its own torchrun
        return Role.WORKER
    raise ConfigError("no role: set GEOMX_ROLE (or GeoMX's DMLC_ROLE / DMLC_ROLE_GLOBAL); "
                      "`geomx launch` sets it for you")


def _address(env: Mapping[str, str], canonical: str, uri: str, port: str) -> str | None:
    value, source = env.get(canonical), canonical
    if not value and env.get(uri) and env.get(port):
        value, source = f"{env[uri]}:{env[port]}", f"{uri}:{port}"
    if not value:
        return None
    return check_address(value, f"{source}={value!r}")


def check_address(value: str, source: str) -> str:
    """``value`` if it is HOST:PORT with a numeric port (0-65535), else ConfigError naming ``source`` (a variable's
    or an option's name): the launcher checks ``--global-scheduler`` as the processes check their variables.

    Usage: ``check_address(args.global_scheduler, "--global-scheduler 'x'")``
    """
    if not re.fullmatch(r"[^:\s]+:\d{1,5}", value) or int(value.rsplit(":", 1)[1]) > 65535:
        raise ConfigError(f"{source} must be HOST:PORT with a numeric port (0-65535)")
    return value


def _topology_from_env(env: Mapping[str, str], role: Role, party: str) -> Topology:
    """A topology for GeoMX-style launches that set only DMLC_* counts (no topology file).

    Only this party's worker count is known; the other parties are placeholders sized so that
    ``num_all_workers`` matches DMLC_NUM_ALL_WORKER. No link emulation.
    """
    num_workers = _count(env, "GEOMX_NUM_WORKERS") or 1
    all_workers = _count(env, "GEOMX_NUM_ALL_WORKERS")
    num_parties = _count(env, "GEOMX_NUM_PARTIES")
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
                    num_global_servers=_count(env, "GEOMX_NUM_GLOBAL_SERVERS") or 1)


def known_variables() -> frozenset[str]:
    """Every GEOMX_* variable the configuration reads: declared on a spec (a field's or a block's switch), or
    read by hand here. Any other GEOMX_<NAME> is a plug-in option."""
    return frozenset((*NODE_VARIABLES, *(name for cls in ENV_SPECS for name in variables(cls))))


def _plugin_options_from_env(env: Mapping[str, str]) -> dict[str, str]:
    """GEOMX_<NAME> variables nothing here reads: plug-in options (GEOMX_STALENESS=2 -> staleness)."""
    known = known_variables()
    return {name.removeprefix("GEOMX_").lower(): value for name, value in env.items()
            if name.startswith("GEOMX_") and name not in known and value != ""}


def training_from_env(env: Mapping[str, str], base: TrainingSpec) -> TrainingSpec:
    """``base`` with the training variables ``env`` sets, plug-in options included (over the topology's)."""
    spec = _overridden(base, env)
    options = _plugin_options_from_env(env)
    if not options:
        return spec
    given = tuple((name, f"GEOMX_{name.upper()}", text) for name, text in sorted(options.items()))
    return dataclasses.replace(spec, plugin_options=tuple(sorted({**dict(spec.plugin_options), **options}.items())),
                               env_origins=(*spec.env_origins, *given))


def job_training(topology: Topology, env: Mapping[str, str]) -> TrainingSpec:
    """The training settings the processes of a job launched with ``env`` will see (geomx launch checks them)."""
    return training_from_env(env, topology.training)


def job_status(topology: Topology, env: Mapping[str, str]) -> StatusSpec:
    """The status page's settings as a job launched with ``env`` runs it (GEOMX_STATUS* over the topology's)."""
    return _overridden(topology.status, env)  # type: ignore[no-any-return]


def _overridden(spec: Any, env: Mapping[str, str]) -> Any:
    """``spec`` with the fields its variables set (GEOMX_* or their GeoMX aliases)."""
    values = env_values(type(spec), env)
    return replaced(spec, values, env) if values else spec


def lan_from_env(topology: Topology, env: Mapping[str, str]) -> Topology:
    """GEOMX_LAN (``server`` or ``collective``) sets every party's LAN tier over the topology's."""
    text = _get(env, "GEOMX_LAN")
    if text is None:
        return topology
    try:
        tier = LanTier(text.strip().lower())
    except ValueError:
        raise ConfigError(f"GEOMX_LAN must be one of {[t.value for t in LanTier]}, got {text!r}") from None
    return dataclasses.replace(topology, parties=tuple(dataclasses.replace(p, lan=tier) for p in topology.parties))


def topology_from_env(topology: Topology, env: Mapping[str, str]) -> Topology:
    """``topology`` with everything ``env`` sets over it: timeouts, the optional blocks (HFA, DGT, TSEngine), the
    LAN tier, the topology's own fields, security, checkpoints, the status page and the training block (P3's
    slice size with it). One function for every process's view and the launcher's, so that what ``geomx launch``
    checks before starting anything is what each process will build (a bad value is refused there, once)."""
    topology = dataclasses.replace(topology, timeouts=_overridden(topology.timeouts, env))
    blocks = {name: block_from_env(cls, env, getattr(topology, name)) for name, cls in OPTIONAL_BLOCKS}
    try:
        topology = dataclasses.replace(lan_from_env(topology, env), **env_values(Topology, env), **blocks,
                                       security=_overridden(topology.security, env),
                                       checkpoint=_overridden(topology.checkpoint, env),
                                       status=job_status(topology, env))
    except ConfigError as exc:  # a top-level value the topology refuses is named by the variable that gave it
        given = [f"{variable}={text!r}" if text is not None else variable
                 for key, variable, text in env_origins(Topology, env) if key in str(exc)]
        if not given:
            raise
        raise ConfigError(f"{', '.join(given)}: {exc}") from None
    training = training_from_env(env, topology.training)
    return dataclasses.replace(topology, training=training,
                               slice_elems=training.p3_slice_elems if training.p3 else topology.slice_elems)


def job_topology(path: str | Path, env: Mapping[str, str]) -> Topology:
    """The topology file at ``path`` as every process of a job launched with ``env`` sees it
    (``topology_from_env``; the job's start time is the launcher's to set)."""
    return topology_from_env(load_topology(path), env)


def torchrun_from_env(env: Mapping[str, str]) -> TorchRun | None:
    """torchrun's variables as a ``TorchRun`` (None when RANK is not set); a partial set is refused, naming what
    is missing."""
    if _get(env, "RANK") is None:
        return None
    missing = [name for name in TORCHRUN_VARIABLES if name not in ("LOCAL_RANK", "LOCAL_WORLD_SIZE")
               and _get(env, name) is None]
    if missing:
        raise ConfigError(f"RANK is set but not {', '.join(missing)}: a collective party's rank needs torchrun's "
                          "variables (start it with `geomx launch` or torchrun)")
    if (_int(env, "TORCHELASTIC_MAX_RESTARTS") or 0) > 0 and _get(env, "TORCHELASTIC_USE_AGENT_STORE") == "True":
        # torchrun's agent keeps one store for every attempt: a restarted group reads its first attempt's addresses
        # there and cannot connect (pytorch/pytorch#135712); said at the first start, not at the first restart
        raise ConfigError("torchrun --max-restarts shares its agent's store with the ranks, where a restarted party "
                          "would find its first attempt's addresses (pytorch/pytorch#135712): start torchrun with "
                          "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1")
    numbers = {name: _int(env, name) for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                                   "MASTER_PORT")}
    rank, world = numbers["RANK"], numbers["WORLD_SIZE"]
    assert rank is not None and world is not None and numbers["MASTER_PORT"] is not None
    return TorchRun(rank=rank, world_size=world,
                    local_rank=numbers["LOCAL_RANK"] if numbers["LOCAL_RANK"] is not None else rank,
                    local_world_size=numbers["LOCAL_WORLD_SIZE"] or world,
                    master_addr=str(_get(env, "MASTER_ADDR")), master_port=numbers["MASTER_PORT"])


def node_config_from_env(env: Mapping[str, str]) -> NodeConfig:
    """Build this process's NodeConfig from the environment set by `geomx launch` (or GeoMX scripts)."""
    role = _role_from_env(env)
    party = env.get("GEOMX_PARTY") or env.get("DMLC_PS_ROOT_URI", "dc0").replace(".", "-") or "dc0"
    if env.get("GEOMX_PARTY") is None and env.get("DMLC_PS_ROOT_PORT"):
        party = f"{party}-{env['DMLC_PS_ROOT_PORT']}"
    topology_path = env.get("GEOMX_TOPOLOGY")
    topology = topology_from_env(load_topology(topology_path) if topology_path else
                                 _topology_from_env(env, role, party), env)
    job_start = _get(env, "GEOMX_JOB_START")
    if job_start is not None:
        topology = dataclasses.replace(topology, job_start=parse_number(job_start, "GEOMX_JOB_START",
                                                                   "seconds since the epoch, as time.time() gives"))
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
        role is Role.WORKER and topology.mode is Mode.HIPS and not topology.is_collective(party))
    if needs_local and scheduler is None:
        raise ConfigError(f"role {role.value} needs its party's scheduler: set GEOMX_SCHEDULER=HOST:PORT "
                          "(or DMLC_PS_ROOT_URI and DMLC_PS_ROOT_PORT)")
    bind_port = 0
    if role is Role.GLOBAL_SCHEDULER:
        bind_port = int(global_scheduler.rsplit(":", 1)[1])
    elif role is Role.LOCAL_SCHEDULER and scheduler is not None:
        bind_port = int(scheduler.rsplit(":", 1)[1])
    run_dir = env.get("GEOMX_RUN_DIR")
    torchrun = torchrun_from_env(env) if role is Role.WORKER and topology.is_collective(party) else None
    if torchrun is not None:
        _check_ranks(torchrun, topology.party(party))
    return NodeConfig(
        role=role,
        party=party,
        topology=topology,
        global_scheduler=global_scheduler,
        scheduler=scheduler,
        rank=_int(env, "GEOMX_RANK"),
        is_master=_flag(env, "GEOMX_MASTER_WORKER"),
        bind_host=_get(env, "GEOMX_HOST") or "127.0.0.1",
        bind_port=bind_port,
        run_dir=Path(run_dir) if run_dir else None,
        worker_offset=_int(env, "GEOMX_WORKER_OFFSET"),
        resume=_flag(env, "GEOMX_RESUME"),
        trace=_flag(env, "GEOMX_TRACE"),
        torchrun=torchrun,
    )


def _check_ranks(run: TorchRun, party: PartySpec) -> None:
    """A collective party's rank started by a torchrun whose rank count is not the party's worker count is refused
    at its start, naming both numbers (else a rank's data shard or slice falls outside the job's, later)."""
    if run.world_size != party.num_workers:
        raise ConfigError(f"party {party.name} has {party.num_workers} workers in the topology but torchrun started "
                          f"{run.world_size} ranks (WORLD_SIZE={run.world_size}): give torchrun --nproc-per-node "
                          f"(times --nnodes) {party.num_workers}, or set parties.{party.name}.workers to "
                          f"{run.world_size}")
    if not 0 <= run.rank < run.world_size:
        raise ConfigError(f"RANK={run.rank} is outside 0..{run.world_size - 1} (WORLD_SIZE={run.world_size})")


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
    if node.torchrun is not None:
        run = node.torchrun
        env.update({"RANK": str(run.rank), "WORLD_SIZE": str(run.world_size), "LOCAL_RANK": str(run.local_rank),
                    "LOCAL_WORLD_SIZE": str(run.local_world_size), "MASTER_ADDR": run.master_addr,
                    "MASTER_PORT": str(run.master_port)})
    for name, text in node.topology.training.plugin_options:
        env[f"GEOMX_{name.upper()}"] = text
    return env
