"""Config declared once: each spec field says its YAML key, environment name, GeoMX alias and kind; the generic
code here reads YAML and the environment and writes both back.

A field is declared with ``setting`` (or ``part`` for a field another one fills, such as a server optimizer's
parameters). Adding a field to a feature is then one line in its spec; ``tests/unit/test_config_fields.py``
walks every declared field and fails on one without its metadata.

Usage::

    @dataclass(frozen=True)
    class HFASpec:
        k1: int = setting(1, kind=INT, env="GEOMX_HFA_K1", aliases=("MXNET_KVSTORE_HFA_K1",), doc="local steps")

    values = read_mapping(HFASpec, {"k1": 4}, "hfa")        # {"k1": 4}
    values = env_values(HFASpec, {"MXNET_KVSTORE_HFA_K1": "4"})
    to_mapping(HFASpec(4, 2)), to_env(HFASpec(4, 2))       # {"k1": 4, "k2": 2}, {"GEOMX_HFA_K1": "4", ...}
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .kinds import ValueKind

_SETTING = "geomx.setting"
_PART_OF = "geomx.part_of"
_EXTRAS = "geomx.extras"


@dataclass(frozen=True)
class Setting:
    """How one field is written: ``key`` in its YAML section, ``env`` (GEOMX_*) and GeoMX's ``aliases``.

    ``companions``: fields this one's value also fills (its kind reads and writes them as one tuple).
    ``written``: False for a value never written back (the shared secret).
    """

    kind: ValueKind
    key: str
    env: str | None = None
    aliases: tuple[str, ...] = ()
    companions: tuple[str, ...] = ()
    written: bool = True
    doc: str = ""


def setting(default: Any = dataclasses.MISSING, *, kind: ValueKind, key: str = "", env: str | None = None,
            aliases: tuple[str, ...] = (), companions: tuple[str, ...] = (), written: bool = True,
            expects: str | None = None, doc: str = "", **field_options: Any) -> Any:
    """A dataclass field with its Setting (``key`` defaults to the field's name)."""
    declared = Setting(kind.expecting(expects) if expects else kind, key, env, aliases, companions, written, doc)
    return dataclasses.field(default=default, metadata={_SETTING: declared}, **field_options)


def part(default: Any, of: str, **field_options: Any) -> Any:
    """A dataclass field filled by field ``of``'s setting (one of its ``companions``)."""
    return dataclasses.field(default=default, metadata={_PART_OF: of}, **field_options)


def extras(**field_options: Any) -> Any:
    """A dataclass field collecting the keys of its section that no field declares, as ((key, text), ...):
    options for plug-ins to validate (a section without one refuses such keys)."""
    return dataclasses.field(default=(), metadata={_EXTRAS: True}, **field_options)


def extras_field(cls: type) -> str | None:
    """The name of ``cls``'s ``extras`` field, if it has one."""
    return next((f.name for f in dataclasses.fields(cls) if f.metadata.get(_EXTRAS)), None)


def settings(cls: type) -> Iterator[tuple[str, Setting]]:
    """(field name, Setting) of every declared field of ``cls``, its key resolved."""
    for spec_field in dataclasses.fields(cls):
        declared = spec_field.metadata.get(_SETTING)
        if declared is not None:
            yield spec_field.name, dataclasses.replace(declared, key=declared.key or spec_field.name)


def undeclared(cls: type) -> list[str]:
    """Fields of ``cls`` with neither a Setting nor a ``part`` (a feature spec must have none)."""
    return [f.name for f in dataclasses.fields(cls) if not {_SETTING, _PART_OF, _EXTRAS} & set(f.metadata)]


def where(section: str, key: str) -> str:
    """How a refusal names a key: ``hfa.k1``, or ``topology field 'fp16'`` at the top level."""
    return f"{section}.{key}" if section else f"topology field {key!r}"


def keys(cls: type) -> list[str]:
    """The YAML keys ``cls`` declares."""
    return [declared.key for _, declared in settings(cls)]


def _spread(name: str, declared: Setting, value: Any) -> dict[str, Any]:
    if not declared.companions:
        return {name: value}
    return dict(zip((name, *declared.companions), value, strict=True))


def read_values(cls: type, raw: Mapping[str, Any], section: str, base_dir: Path | None = None) -> dict[str, Any]:
    """Field values of ``cls`` from the declared keys present in ``raw`` (others are the caller's business)."""
    values: dict[str, Any] = {}
    for name, declared in settings(cls):
        if raw.get(declared.key) is not None:
            value = declared.kind.from_yaml(raw[declared.key], where(section, declared.key), base_dir)
            values.update(_spread(name, declared, value))
    return values


def read_mapping(cls: type, raw: Any, section: str, base_dir: Path | None = None) -> dict[str, Any]:
    """Field values of ``cls`` from its YAML section ``raw``; a key it does not declare is refused, naming the
    key, the section and the valid keys, unless ``cls`` has an ``extras`` field, which collects them."""
    allowed = keys(cls)
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{section} must be a mapping with some of {sorted(allowed)}, got {raw!r}")
    unknown = sorted(str(k) for k in set(raw) - set(allowed))
    values = read_values(cls, raw, section, base_dir)
    collector = extras_field(cls)
    if unknown and collector is None:
        raise ConfigError(f"{section} has unknown fields {unknown}; allowed: {sorted(allowed)}")
    if collector is not None and unknown:
        values[collector] = tuple((key, option_text(raw[key], where(section, key))) for key in unknown)
    return values


def option_text(value: Any, what: str) -> str:
    """A plug-in option's YAML value as the text a plug-in parses (flags as ``true``/``false``)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (str, int, float)):
        return str(value)
    raise ConfigError(f"{what} (a plug-in option) must be a number, a string or a flag, got {value!r}")


def lookup(env: Mapping[str, str], name: str, aliases: tuple[str, ...] = ()) -> str | None:
    """The value of ``name`` or else of its first alias set (an empty value counts as unset)."""
    for candidate in (name, *aliases):
        value = env.get(candidate)
        if value not in (None, ""):
            return value
    return None


def env_values(cls: type, env: Mapping[str, str]) -> dict[str, Any]:
    """Field values of ``cls`` from the environment variables (or their aliases) that are set."""
    values: dict[str, Any] = {}
    for name, declared in settings(cls):
        text = lookup(env, declared.env, declared.aliases) if declared.env else None
        if text is not None:
            values.update(_spread(name, declared, declared.kind.from_text(text, declared.env or name)))
    return values


def _value(spec: Any, name: str, declared: Setting) -> Any:
    if declared.companions:
        return tuple(getattr(spec, n) for n in (name, *declared.companions))
    return getattr(spec, name)


def to_mapping(spec: Any) -> dict[str, Any]:
    """``spec``'s declared fields (and extras) as its YAML section (None values and unwritten fields left out)."""
    out: dict[str, Any] = {}
    for name, declared in settings(type(spec)):
        value = _value(spec, name, declared)
        if declared.written and value is not None:
            out[declared.key] = declared.kind.to_yaml(value)
    collector = extras_field(type(spec))
    return {**out, **dict(getattr(spec, collector))} if collector else out


def to_env(spec: Any) -> dict[str, str]:
    """``spec``'s declared fields as environment variables (their GEOMX_* names)."""
    out: dict[str, str] = {}
    for name, declared in settings(type(spec)):
        value = _value(spec, name, declared)
        if declared.env and value is not None:
            out[declared.env] = declared.kind.to_text(value)
    return out


def aliases_of(*classes: type) -> dict[str, tuple[str, ...]]:
    """GEOMX_* name -> GeoMX's names, over the declared fields of ``classes``."""
    return {d.env: d.aliases for cls in classes for _, d in settings(cls) if d.env and d.aliases}
