"""Topology files: YAML -> ``Topology`` (every key checked) and back, for writing a resolved topology next to a run.

Usage::

    topology = load_topology("topologies/demo.yaml")
    (run_dir / "topology.yaml").write_text(yaml.safe_dump(topology_to_dict(topology)))
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError
from .specs import (CheckpointSpec, DGTSpec, HFASpec, LinkSpec, Mode, Outage, PartySpec, SecuritySpec, Timeouts,
                    TrainingSpec, TSEngineSpec)
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
                    "max_message_bytes", "hfa", "size_lower_bound", "fp16", "training", "security", "checkpoint",
                    "elastic", "dgt", "tsengine", "outages"}


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


def dgt_from_yaml(raw: Any, base: DGTSpec | None = None) -> DGTSpec | None:
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


def training_from_yaml(raw: Any, base: TrainingSpec | None = None) -> TrainingSpec:
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
        secret = read_secret(_path(raw["secret_file"], "security.secret_file", base_dir))
    keys = _path(raw["curve_keys"], "security.curve_keys", base_dir) if raw.get("curve_keys") else None
    return SecuritySpec(secret=secret, curve_keys=keys)


def read_secret(path: Path) -> str:
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
        training=training_from_yaml(raw.get("training")),
        security=_security(raw.get("security"), base_dir),
        checkpoint=_checkpoint(raw.get("checkpoint"), base_dir),
        elastic=_bool_field(raw, "elastic", False),
        dgt=dgt_from_yaml(raw.get("dgt")),
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


