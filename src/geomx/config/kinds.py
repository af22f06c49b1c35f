"""Value kinds of config fields: how one value is read from YAML and from environment text, and written back.

A kind refuses a bad value naming where it was found (``hfa.k2``, ``GEOMX_P3``), the value and what it
expects. ``fields.setting`` attaches a kind to a spec field; the generic code in ``fields`` does the rest.

Usage::

    INT.from_yaml(3, "hfa.k1", None)            # 3
    BOOL.from_text("maybe", "GEOMX_P3")         # ConfigError: GEOMX_P3 must be 0 or 1, got 'maybe'
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError
from .units import parse_bandwidth, parse_duration

# the texts a flag reads as on and as off (compared in lower case)
TRUE_TEXTS = ("1", "true", "yes", "on")
FALSE_TEXTS = ("0", "false", "no", "off")


@dataclass(frozen=True)
class ValueKind:
    """One kind of value. A YAML value passes ``check`` (then ``convert``), or ``read`` converts it itself;
    ``from_text(text, name)`` reads environment text. Both give the typed value or raise ConfigError;
    ``to_yaml`` and ``to_text`` write it back so that reading it gives it again."""

    expects: str
    check: Callable[[Any], bool] | None
    read: Callable[[Any, str, Path | None], Any] | None
    from_text: Callable[[str, str], Any]
    to_yaml: Callable[[Any], Any]
    to_text: Callable[[Any], str]
    convert: Callable[[Any], Any] = lambda value: value

    def from_yaml(self, value: Any, where: str, base_dir: Path | None) -> Any:
        """The typed value of a YAML ``value`` found at ``where``."""
        if self.read is not None:
            return self.read(value, where, base_dir)
        if self.check is not None and not self.check(value):
            raise bad(where, self.expects, value)
        return self.convert(value)

    def expecting(self, expects: str) -> ValueKind:
        """This kind, its refusals saying ``expects`` (e.g. ``bool`` where the docs use Python's type names)."""
        return replace(self, expects=expects)


def bad(where: str, expects: str, value: Any) -> ConfigError:
    """The one refusal text of a bad value."""
    return ConfigError(f"{where} must be {expects}, got {value!r}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _text_int(text: str, name: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise bad(name, "an integer", text) from None


def _text_float(text: str, name: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise bad(name, "a number", text) from None


def _text_bool(text: str, name: str) -> bool:
    if text.lower() in TRUE_TEXTS:
        return True
    if text.lower() in FALSE_TEXTS:
        return False
    raise bad(name, "0 or 1", text)


def _floats(value: Any, where: str, base_dir: Path | None = None) -> tuple[float, ...]:
    items = value.split(",") if isinstance(value, str) else value if isinstance(value, list | tuple) else [value]
    try:
        return tuple(float(x) for x in items if not isinstance(x, bool))
    except (TypeError, ValueError):
        raise bad(where, "a number or a list of numbers", value) from None


def _path(value: Any, where: str, base_dir: Path | None) -> Path:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where} must be a path, got {value!r}")
    path = Path(value).expanduser()
    return path if path.is_absolute() or base_dir is None else base_dir / path


def read_secret(path: Path) -> str:
    """The shared secret in a file (surrounding whitespace dropped): ``security.secret_file`` and the variable
    ``GEOMX_SECRET_FILE`` (``Setting.file_env``) both read it so, keeping the secret out of the environment."""
    try:
        return path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read the shared secret from {path}: {exc}") from None


class YamlLoader(yaml.SafeLoader):
    """PyYAML's safe loader, reading ``3e-3`` as the number YAML 1.2 (and every reader) takes it for: YAML 1.1's
    float needs a dot (``3.0e-3``), so ``lr: 3e-3`` was the string '3e-3' and refused as "must be a number"."""


YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))


def load_yaml(text: str) -> Any:
    """``text`` as YAML, numbers in exponent form included (``YamlLoader``); yaml.YAMLError when it is not."""
    return yaml.load(text, Loader=YamlLoader)  # a SafeLoader


def named_spec(raw: Any, where: str) -> tuple[str, dict[str, Any]]:
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
        if key.strip() == "type":  # {type: name, ...} is how the spec is written back: the name's place
            raise ConfigError(f"{where}: 'type' names the spec ({name.strip()!r}); no parameter may be called that")
        params[key.strip()] = load_yaml(value)
    return name.strip().lower(), params


def _numbers(params: Mapping[str, Any], where: str) -> tuple[tuple[str, float], ...]:
    out = []
    for key, value in params.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: parameter {key}={value!r} must be a number")
        out.append((key, float(value)))
    return tuple(out)


def _optimizer(raw: Any, where: str, base_dir: Path | None = None) -> tuple[str, tuple[tuple[str, float], ...]]:
    name, params = named_spec(raw, where)
    return name, _numbers(params, where)


def _codec(raw: Any, where: str, base_dir: Path | None = None) -> dict[str, Any]:
    name, params = named_spec(raw, where)
    return {"type": name, **params}


def _as_is(value: Any) -> Any:
    return value


def _placed(parse: Callable[[Any], Any], value: Any, where: str) -> Any:
    """``parse(value)``, a refusal prefixed with where the value was found: the units' parsers do not know it, and
    ``cannot read duration 'abc'`` alone does not say which of a job's settings to fix (``GEOMX_TIMEOUT: ...``)."""
    try:
        return parse(value)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


INT = ValueKind("an integer", _is_int, None, _text_int, _as_is, str)
FLOAT = ValueKind("a number", _is_number, None, _text_float, _as_is, repr, convert=float)
BOOL = ValueKind("true or false", lambda v: isinstance(v, bool), None, _text_bool, _as_is, lambda v: "1" if v else "0")
STR = ValueKind("a string", lambda v: isinstance(v, str), None, lambda text, name: text, _as_is, str)
DURATION = ValueKind("a duration like '25ms'", None, lambda v, where, _: _placed(parse_duration, v, where),
                     lambda text, name: _placed(parse_duration, text, name), _as_is, repr)
BANDWIDTH = ValueKind("a bandwidth like '100Mbit'", None, lambda v, where, _: _placed(parse_bandwidth, v, where),
                      lambda text, name: _placed(parse_bandwidth, text, name), _as_is, repr)
FLOATS = ValueKind("a number or a list of numbers", None, _floats, lambda text, name: _floats(text, name), list,
              lambda v: ",".join(repr(x) for x in v))
PATH = ValueKind("a path", None, _path, lambda text, name: Path(text), str, str)
# a server optimizer: (name, ((param, value), ...)); written as {type: name, param: value}
OPTIMIZER = ValueKind("a name like 'dcasgd' or 'dcasgd:lamda=0.04'", None, _optimizer,
                 lambda text, name: _optimizer(text, name), lambda v: {"type": v[0], **dict(v[1])},
                 lambda v: json.dumps({"type": v[0], **dict(v[1])}))
# a codec spec: {"type": name, param: value}
CODEC = ValueKind("a codec like 'bsc:threshold=0.01'", None, _codec, lambda text, name: _codec(text, name), dict,
                  json.dumps)
