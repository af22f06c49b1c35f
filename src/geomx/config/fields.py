"""Config declared once: each spec field says its YAML key, environment name, GeoMX alias and kind; the generic
code here reads YAML and the environment and writes both back.

A field is declared with ``setting`` (or ``filled_by`` for a field another one fills, such as a server optimizer's
parameters). Adding a field to a feature is then one line in its spec; ``tests/unit/test_config_fields.py``
walks every declared field and fails on one without its metadata.

Usage::

    @dataclass(frozen=True)
    class HFASpec:
        k1: int = setting(1, kind=INT, env="GEOMX_HFA_K1", aliases=("MXNET_KVSTORE_HFA_K1",), doc="local steps")

    values = read_mapping(HFASpec, {"k1": 4}, "hfa")        # {"k1": 4}
    values = env_values(HFASpec, {"MXNET_KVSTORE_HFA_K1": "4"})
    to_mapping(HFASpec(4, 2)), to_env(HFASpec(4, 2))       # {"k1": 4, "k2": 2}, {"GEOMX_HFA_K1": "4", ...}

An optional block (``hfa``, ``dgt``, ``tsengine``) also declares how the environment switches it on and off: a
``Switch`` as the spec's ``switch`` class variable, which ``block_from_env`` reads with the fields' variables.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from .errors import ConfigError
from .kinds import FALSE_TEXTS, TRUE_TEXTS, ValueKind, read_secret

_SETTING = "geomx.setting"
_FILLED_BY = "geomx.filled_by"
_EXTRAS = "geomx.extras"
_ORIGINS = "geomx.origins"

SpecT = TypeVar("SpecT")


@dataclass(frozen=True)
class Setting:
    """How one field is written: ``key`` in its YAML section, ``env`` (GEOMX_*) and GeoMX's ``aliases``.

    ``companions``: fields this one's value also fills (its kind reads and writes them as one tuple).
    ``written``: False for a value never written back (the shared secret).
    ``file_env``: a variable naming a file that holds the value (read with ``kinds.read_secret``), for a value
    kept out of the environment; ``env`` wins when both are set.
    ``doc``: what the setting does, with its unit: the configuration reference's "meaning" column.
    """

    kind: ValueKind
    key: str
    env: str | None = None
    aliases: tuple[str, ...] = ()
    companions: tuple[str, ...] = ()
    written: bool = True
    doc: str = ""
    file_env: str | None = None


def setting(default: Any = dataclasses.MISSING, *, kind: ValueKind, key: str = "", env: str | None = None,
            aliases: tuple[str, ...] = (), companions: tuple[str, ...] = (), written: bool = True,
            expects: str | None = None, doc: str = "", file_env: str | None = None, **field_options: Any) -> Any:
    """A dataclass field with its Setting (``key`` defaults to the field's name)."""
    declared = Setting(kind.expecting(expects) if expects else kind, key, env, aliases, companions, written, doc,
                       file_env)
    return dataclasses.field(default=default, metadata={_SETTING: declared}, **field_options)


@dataclass(frozen=True)
class Switch:
    """How the environment turns a spec's optional topology block on or off; ``block_from_env`` applies it.

    Declared once on the spec, as its ``switch`` class variable, so that the reader, ``known_variables`` and the
    reference all learn the switch from one place. ``env`` (with GeoMX's ``aliases``): a variable whose ``on``
    texts turn the block on and whose ``off`` texts turn it off (compared stripped, in lower case); any other
    text is refused as not ``expects``. ``flags``: boolean fields of the spec whose variables switch it instead
    (TSEngine's ``inter`` and ``intra``): the switch is set when any of their variables is, and on when any flag
    ends up on. ``doc``: the reference's line on the switch variable.

    Usage::

        @dataclass(frozen=True)
        class HFASpec:
            switch: ClassVar[Switch] = Switch("GEOMX_HFA", ("MXNET_KVSTORE_USE_HFA",), doc="HFA on or off")
    """

    env: str | None = None
    aliases: tuple[str, ...] = ()
    on: tuple[str, ...] = TRUE_TEXTS
    off: tuple[str, ...] = FALSE_TEXTS
    expects: str = "0 or 1"
    flags: tuple[str, ...] = ()
    doc: str = ""

    def state(self, env: Mapping[str, str]) -> bool | None:
        """What the switch variable says: True (on), False (off) or None (not set, or no variable)."""
        text = lookup(env, self.env, self.aliases) if self.env else None
        if self.env is None or text is None:
            return None
        word = text.strip().lower()
        if word not in (*self.on, *self.off):
            raise ConfigError(f"{' / '.join((self.env, *self.aliases))} must be {self.expects}, got {text!r}")
        return word in self.on


def switch_of(cls: type) -> Switch:
    """``cls``'s declared ``switch``; a spec without one has a switch that is never set (always-present sections)."""
    declared = getattr(cls, "switch", None)
    return declared if isinstance(declared, Switch) else Switch()


def filled_by(default: Any, of: str, **field_options: Any) -> Any:
    """A dataclass field filled by field ``of``'s setting (one of its ``companions``)."""
    return dataclasses.field(default=default, metadata={_FILLED_BY: of}, **field_options)


def extras(**field_options: Any) -> Any:
    """A dataclass field collecting the keys of its section that no field declares, as ((key, text), ...):
    options for plug-ins to validate (a section without one refuses such keys)."""
    return dataclasses.field(default=(), metadata={_EXTRAS: True}, **field_options)


def origins(**field_options: Any) -> Any:
    """A dataclass field recording which of the spec's settings the environment gave, as ((key, variable, text),
    ...) (text None for a value never written back, such as a secret): ``env_values`` fills it, so that a
    refusal made outside this layer names the variable (``named``) rather than a YAML key the user never wrote.
    Not compared, hashed or shown: where a value came from is not what the spec is."""
    return dataclasses.field(default=(), metadata={_ORIGINS: True}, compare=False, hash=False, repr=False,
                             **field_options)


def origins_field(cls: type) -> str | None:
    """The name of ``cls``'s ``origins`` field, if it has one."""
    return next((f.name for f in dataclasses.fields(cls) if f.metadata.get(_ORIGINS)), None)


def named(spec: Any, key: str, section: str) -> str:
    """How a refusal names setting ``key`` of ``spec`` (its YAML ``section``; ``key`` may be a plug-in option):
    the variable and the text it gave where the environment set it (``GEOMX_SYNC='dist_foo'``), else the YAML key
    and the value (``training.sync 'dist_foo'``).

    Usage: ``raise ConfigError(f"{named(training, 'sync', 'training')} is unknown; valid: ...")``
    """
    collector = origins_field(type(spec))
    for given, variable, text in getattr(spec, collector) if collector else ():
        if given == key:
            return f"{variable}={text!r}" if text is not None else variable
    field_name = next((name for name, declared in settings(type(spec)) if declared.key == key), None)
    if field_name is None:
        return where(section, key)
    return f"{where(section, key)} {getattr(spec, field_name)!r}"


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
    """Fields of ``cls`` with neither a Setting nor a ``filled_by`` (a feature spec must have none)."""
    return [f.name for f in dataclasses.fields(cls)
            if not {_SETTING, _FILLED_BY, _EXTRAS, _ORIGINS} & set(f.metadata)]


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


def closest(key: str, allowed: Iterable[str]) -> str | None:
    """The allowed key ``key`` most likely misspells (case aside: ``K2`` is ``k2``), or None."""
    allowed = list(allowed)
    by_case = {name.lower(): name for name in allowed}
    if key.lower() in by_case:
        return by_case[key.lower()]
    close = difflib.get_close_matches(key.lower(), list(by_case), n=1)
    return by_case[close[0]] if close else None


def unknown_fields(where: str, unknown: Iterable[str], allowed: Iterable[str]) -> ConfigError:
    """The refusal of keys ``where`` does not take: each that looks like a misspelt allowed key says which (every
    section alike, the top level too), then the allowed keys.

    Usage: ``raise unknown_fields("topology", ["traning"], TOPOLOGY_KEYS)`` -> ``topology has unknown fields
    ['traning'] (did you mean 'training'?); allowed: [...]``
    """
    unknown, allowed = sorted(str(key) for key in unknown), sorted(allowed)
    guesses = [(key, close) for key in unknown if (close := closest(key, allowed)) is not None]
    hint = ""
    if len(unknown) == 1 and guesses:
        hint = f" (did you mean {guesses[0][1]!r}?)"
    elif guesses:
        hint = f" (did you mean {', '.join(f'{close!r} for {key!r}' for key, close in guesses)}?)"
    return ConfigError(f"{where} has unknown fields {unknown}{hint}; allowed: {allowed}")


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
        raise unknown_fields(section, unknown, allowed)
    if collector is not None and unknown:
        for key in unknown:  # a plug-in option is a scalar: a mapping or list here is a misspelt field
            if not isinstance(raw[key], (bool, str, int, float)):
                close = closest(key, allowed)
                hint = f"; did you mean {close!r}?" if close else ""
                raise ConfigError(f"{section} has an unknown field {key!r}{hint} (not a plug-in option either: those "
                                  f"are numbers, strings or flags, and its value is {raw[key]!r}); allowed: "
                                  f"{sorted(allowed)}")
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
    found = lookup_named(env, name, aliases)
    return found[1] if found is not None else None


def lookup_named(env: Mapping[str, str], name: str, aliases: tuple[str, ...] = ()) -> tuple[str, str] | None:
    """(the variable set, its value) for ``name`` or else its first alias set: a refusal names the variable the
    user wrote (``DMLC_K='abc'``), not our name for it, which they may never have seen."""
    for candidate in (name, *aliases):
        value = env.get(candidate)
        if value not in (None, ""):
            return candidate, value
    return None


def env_values(cls: type, env: Mapping[str, str]) -> dict[str, Any]:
    """Field values of ``cls`` from the environment variables (or their aliases) that are set; a field's
    ``file_env`` variable, where its own is not set, names a file holding the value."""
    values: dict[str, Any] = {}
    for name, declared, source, text in _env_texts(cls, env):
        values.update(_spread(name, declared, declared.kind.from_text(text, source)))
    return values


def _env_texts(cls: type, env: Mapping[str, str]) -> Iterator[tuple[str, Setting, str, str]]:
    """(field name, its Setting, the variable read, its text) of every field of ``cls`` that ``env`` sets."""
    for name, declared in settings(cls):
        given = lookup_named(env, declared.env, declared.aliases) if declared.env else None  # named as set
        if given is None and declared.file_env:
            path = lookup(env, declared.file_env)
            if path is not None:
                given = declared.file_env, read_secret(Path(path))
        if given is not None:
            yield name, declared, given[0], given[1]


def env_origins(cls: type, env: Mapping[str, str]) -> tuple[tuple[str, str, str | None], ...]:
    """(key, variable, text) of every setting of ``cls`` that ``env`` gives (text None for a value never shown:
    a secret, or one read from a file): what an ``origins`` field holds."""
    return tuple((declared.key, source, text if declared.written and source != declared.file_env else None)
                 for _, declared, source, text in _env_texts(cls, env))


def replaced(base: SpecT, values: Mapping[str, Any], env: Mapping[str, str]) -> SpecT:
    """``base`` with ``values`` read from ``env`` (``env_values``), its ``origins`` field (if any) recording the
    variables that gave them; a value its spec then refuses (``__post_init__``) is named by those variables
    (``GEOMX_BUCKET_MB='0': training.bucket_mb must be positive``).

    Usage: ``replaced(topology.training, env_values(TrainingSpec, env), env)``
    """
    given = env_origins(type(base), env)
    collector = origins_field(type(base))
    extra = {collector: (*getattr(base, collector), *given)} if collector is not None and given else {}
    try:
        return dataclasses.replace(base, **values, **extra)  # type: ignore[type-var]
    except ConfigError as exc:
        named_here = [g for g in given if g[0] in str(exc)] or given  # the ones the refusal is about, else all
        shown = ", ".join(f"{variable}={text!r}" if text is not None else variable for _, variable, text in named_here)
        if not shown:
            raise
        raise ConfigError(f"{shown}: {exc}") from None


def block_from_env(cls: type[SpecT], env: Mapping[str, str], base: SpecT | None) -> SpecT | None:
    """The topology's optional block ``base`` of spec ``cls`` (None: the topology has none) as ``env`` leaves it.

    One rule for every block, from the spec's ``switch`` (``Switch``) and its fields' variables:

    - switch set off: None (no block, whatever the topology says);
    - switch set on: ``base`` (or, without one, ``cls``'s defaults) with the values of the variables set;
    - switch not set: ``base`` with the values of the variables set if the topology has a block, else None
      (variables alone do not turn a block on).

    A switch with ``flags`` (TSEngine's ``inter`` / ``intra``) is set when any flag's variable is; a flag not set
    keeps the block's value, off without a block, and the switch is on when any flag ends up on (both off: no
    block). Every variable of ``cls`` is read and checked, so a bad value (``DMLC_K=7``) is refused even where the
    block ends up off, as it would be where it is on. A spec without a switch (``timeouts``, ``security`` ...) is
    never switched: ``base`` with the variables' values.

    Usage: ``hfa = block_from_env(HFASpec, os.environ, topology.hfa)``
    """
    switch = switch_of(cls)
    state = switch.state(env)
    values = env_values(cls, env)
    if any(flag in values for flag in switch.flags):
        flags = {flag: values.get(flag, getattr(base, flag) if base is not None else False) for flag in switch.flags}
        values.update(flags)
        state = state is not False and any(flags.values())
    if state is False or (state is None and base is None):  # off, its values checked as they would be if on
        replaced(base if base is not None else cls(), {k: v for k, v in values.items() if k not in switch.flags}, env)
        return None
    return replaced(base if base is not None else cls(), values, env)


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
    """GEOMX_* name -> GeoMX's names, over the declared fields and switches of ``classes``."""
    declared = {d.env: d.aliases for cls in classes for _, d in settings(cls) if d.env and d.aliases}
    switches = {s.env: s.aliases for s in map(switch_of, classes) if s.env and s.aliases}
    return {**declared, **switches}


def variables(cls: type) -> Iterator[str]:
    """Every GEOMX_* variable ``cls`` declares: its fields' (and their ``file_env``) and its switch's."""
    for _, declared in settings(cls):
        yield from filter(None, (declared.env, declared.file_env))
    if switch_of(cls).env:
        yield str(switch_of(cls).env)
