"""Topology files: YAML -> ``Topology`` (every key checked) and back, for writing a resolved topology next to a run.

Usage::

    topology = load_topology("topologies/demo.yaml")
    (run_dir / "topology.yaml").write_text(yaml.safe_dump(topology_to_dict(topology)))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError
from .fields import keys, read_mapping, read_values, to_mapping, unknown_fields
from .kinds import PATH, load_yaml, read_secret
from .specs import (
    CheckpointSpec,
    DGTSpec,
    HFASpec,
    LanTier,
    LinkSpec,
    Mode,
    Outage,
    PartySpec,
    SecuritySpec,
    Timeouts,
    TrainingSpec,
    TSEngineSpec,
)
from .status import StatusSpec
from .topology import AUTO_SLICE_ELEMS, Topology
from .units import parse_bandwidth, parse_duration


def _link(raw: Any, where: str, ingress_allowed: bool = False) -> LinkSpec:
    if raw is None:
        return LinkSpec()
    allowed = ["bandwidth", "latency"] + (["ingress"] if ingress_allowed else [])
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where} must be a mapping with {', '.join(repr(a) for a in allowed)}")
    unknown = set(raw) - set(allowed)
    if unknown:
        raise unknown_fields(where, unknown, allowed)
    ingress = raw.get("ingress", False)
    if not isinstance(ingress, bool):
        raise ConfigError(f"{where}.ingress must be true or false, got {ingress!r}")
    bandwidth = parse_bandwidth(raw.get("bandwidth"))
    if ingress and bandwidth is None:
        raise ConfigError(f"{where}.ingress needs a bandwidth (the rate a node receives at)")
    return LinkSpec(bandwidth, parse_duration(raw.get("latency")), ingress)


# the sections and fields read by hand below, and every field the Topology declares with its metadata
_TOPOLOGY_FIELDS = {"parties", "central", "mode", "links", "timeouts", "slice_elems", "hfa", "training", "security",
                    "checkpoint", "status", "dgt", "tsengine", "outages", *keys(Topology)}


def timeouts_from_yaml(raw: Any) -> Timeouts:
    """The topology's ``timeouts`` block: durations by name (``register: 60s``)."""
    return Timeouts() if raw is None else Timeouts(**read_mapping(Timeouts, raw, "timeouts"))


def hfa_from_yaml(raw: Any) -> HFASpec | None:
    """The topology's ``hfa`` block: ``{k1: 4, k2: 2}`` (absent or false: no HFA)."""
    if raw is None or raw is False:
        return None
    return HFASpec(**read_mapping(HFASpec, raw, "hfa"))


def dgt_from_yaml(raw: Any, base: DGTSpec | None = None) -> DGTSpec | None:
    """The topology's ``dgt`` block: ``true``, or a mapping of DGTSpec's keys (durations and rates as text)."""
    if raw is None or raw is False:
        return base
    if raw is True:
        return base or DGTSpec()
    return dataclasses.replace(base or DGTSpec(), **read_mapping(DGTSpec, raw, "dgt"))


def tsengine_from_yaml(raw: Any) -> TSEngineSpec | None:
    """The topology's ``tsengine`` block: ``true`` or ``{max_greed: 0.9, seed: 0, inter: true, intra: false}``;
    both switches off: no TSEngine."""
    if raw is None or raw is False:
        return None
    if raw is True:
        return TSEngineSpec()
    values = read_mapping(TSEngineSpec, raw, "tsengine")
    if not values.get("inter", True) and not values.get("intra", False):
        return None
    return TSEngineSpec(**values)


def training_from_yaml(raw: Any, base: TrainingSpec | None = None) -> TrainingSpec:
    """The ``training`` block of a topology (every field optional)."""
    base = base or TrainingSpec()
    return base if raw is None else dataclasses.replace(base, **read_mapping(TrainingSpec, raw, "training"))


def security_from_yaml(raw: Any, base_dir: Path | None) -> SecuritySpec:
    """The ``security`` block: ``secret`` or ``secret_file``, and/or ``curve_keys``."""
    if raw is None:
        return SecuritySpec()
    if isinstance(raw, Mapping) and "secret_file" in raw:
        if "secret" in raw:
            raise ConfigError("security: give 'secret' or 'secret_file', not both")
        secret_file = PATH.from_yaml(raw["secret_file"], "security.secret_file", base_dir)
        raw = {**{k: v for k, v in raw.items() if k != "secret_file"}, "secret": read_secret(secret_file)}
    return SecuritySpec(**read_mapping(SecuritySpec, raw, "security", base_dir))


def checkpoint_from_yaml(raw: Any, base_dir: Path | None) -> CheckpointSpec:
    """The ``checkpoint`` block: ``{dir: ckpt, every_steps: 50, every_seconds: 600s, keep: 3}``."""
    return CheckpointSpec() if raw is None else CheckpointSpec(**read_mapping(CheckpointSpec, raw, "checkpoint",
                                                                              base_dir))


def status_from_yaml(raw: Any) -> StatusSpec:
    """The ``status`` block: ``{host: 0.0.0.0, port: 9100}``; ``true`` or absent: on, at 127.0.0.1 and a free port;
    ``false``: off."""
    if raw is None or raw is True:
        return StatusSpec()
    if raw is False:
        return StatusSpec(enabled=False)
    return StatusSpec(**read_mapping(StatusSpec, raw, "status"))


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


def _lan_tier(value: Any, where: str) -> LanTier:
    """A LAN tier's name (``server`` or ``collective``), refused naming ``where`` otherwise."""
    try:
        return LanTier(str(value).lower())
    except ValueError:
        raise ConfigError(f"{where} must be one of {[t.value for t in LanTier]} (a party's LAN tier), "
                          f"got {value!r}") from None


def topology_from_dict(raw: Mapping[str, Any], base_dir: Path | None = None) -> Topology:
    """Build a Topology from the YAML structure documented in ``topologies/demo.yaml``.

    ``base_dir``: relative paths (checkpoint dir, secret file, CURVE keys) are relative to it.
    """
    if not isinstance(raw, Mapping):
        raise ConfigError("a topology must be a mapping at the top level")
    unknown = set(raw) - _TOPOLOGY_FIELDS
    if unknown:
        raise unknown_fields("topology", unknown, _TOPOLOGY_FIELDS)
    raw_parties = raw.get("parties")
    if not isinstance(raw_parties, Mapping) or not raw_parties:
        raise ConfigError("topology needs 'parties': a mapping of party name to {workers: N}")
    links = raw.get("links") or {}
    if not isinstance(links, Mapping) or set(links) - {"lan", "wan"}:
        raise ConfigError("'links' may hold only 'lan' and 'wan'")
    # `links: {lan: collective}` makes every party's LAN tier a collective group (a party's own `lan` wins)
    default_lan = _lan_tier(links["lan"], "links.lan") if isinstance(links.get("lan"), str) else LanTier.SERVER
    lan_link = None if isinstance(links.get("lan"), str) else links.get("lan")
    parties = []
    for name, spec in raw_parties.items():
        fields = {"workers", "wan", "access", "lan"}
        if isinstance(spec, Mapping) and set(spec) - fields:  # (before 'workers': `{wokers: 2}` is a misspelling)
            raise unknown_fields(f"party {name!r}", set(spec) - fields, fields)
        workers = spec.get("workers") if isinstance(spec, Mapping) else spec
        if not isinstance(workers, int) or isinstance(workers, bool):
            raise ConfigError(f"party {name!r} needs an integer 'workers'")
        wan = _link(spec.get("wan"), f"parties.{name}.wan") if isinstance(spec, Mapping) and spec.get("wan") else None
        access = parse_bandwidth(spec.get("access")) if isinstance(spec, Mapping) else None
        lan = (_lan_tier(spec["lan"], f"parties.{name}.lan") if isinstance(spec, Mapping) and "lan" in spec
               else default_lan)
        parties.append(PartySpec(str(name), workers, wan, access, lan))
    mode_text = str(raw.get("mode", "hips")).lower()
    try:
        mode = Mode(mode_text)
    except ValueError:
        raise ConfigError(f"unknown mode {mode_text!r}; valid: {[m.value for m in Mode]}") from None
    return Topology(
        parties=tuple(parties),
        central=str(raw.get("central", parties[0].name)),
        mode=mode,
        lan=_link(lan_link, "links.lan", ingress_allowed=True),
        wan=_link(links.get("wan"), "links.wan"),
        timeouts=timeouts_from_yaml(raw.get("timeouts")),
        slice_elems=_slice_elems(raw["slice_elems"]) if "slice_elems" in raw else AUTO_SLICE_ELEMS,
        hfa=hfa_from_yaml(raw.get("hfa")),
        training=training_from_yaml(raw.get("training")),
        security=security_from_yaml(raw.get("security"), base_dir),
        checkpoint=checkpoint_from_yaml(raw.get("checkpoint"), base_dir),
        status=status_from_yaml(raw.get("status")),
        dgt=dgt_from_yaml(raw.get("dgt")),
        tsengine=tsengine_from_yaml(raw.get("tsengine")),
        outages=_outages(raw.get("outages")),
        **read_values(Topology, raw, ""),
    )


def _slice_elems(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"topology field 'slice_elems' must be an integer, got {value!r}")
    if value < 1:
        raise ConfigError(f"slice_elems must be positive, got {value}")
    return value




def load_topology(path: str | Path) -> Topology:
    """Read a YAML topology file."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read topology file {path}: {exc}") from exc
    try:
        raw = load_yaml(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"topology file {path} is not valid YAML: {exc}") from exc
    return topology_from_dict(raw, Path(path).resolve().parent)


def topology_to_dict(topology: Topology) -> dict[str, Any]:
    """The inverse of topology_from_dict, for writing a resolved topology next to a run (never the secret)."""

    def link(spec: LinkSpec) -> dict[str, Any]:
        ingress = {"ingress": True} if spec.ingress else {}
        return {"bandwidth": spec.bandwidth_bps, "latency": spec.latency_s, **ingress}

    optional = {"hfa": topology.hfa, "dgt": topology.dgt, "tsengine": topology.tsengine}
    return {
        "parties": {p.name: {"workers": p.num_workers, **({"wan": link(p.wan)} if p.wan else {}),
                             **({"access": p.access_bps} if p.access_bps is not None else {}),
                             **({"lan": p.lan.value} if p.lan is not LanTier.SERVER else {})}
                    for p in topology.parties},
        "central": topology.central,
        "mode": topology.mode.value,
        "links": {"lan": link(topology.lan), "wan": link(topology.wan)},
        "slice_elems": topology.slice_elems,
        **to_mapping(topology),
        "timeouts": to_mapping(topology.timeouts),
        "training": to_mapping(topology.training),
        **({"security": to_mapping(topology.security)} if to_mapping(topology.security) else {}),
        **({"checkpoint": to_mapping(topology.checkpoint)} if topology.checkpoint.dir else {}),
        **({"status": to_mapping(topology.status)} if topology.status != StatusSpec() else {}),
        **{key: to_mapping(spec) for key, spec in optional.items() if spec is not None},
        **({"outages": [{"party": o.party, "start": o.start_s, "duration": o.duration_s, "from": o.origin}
                        for o in topology.outages]}
           if topology.outages else {}),
    }
