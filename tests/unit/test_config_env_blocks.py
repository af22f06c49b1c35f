"""The environment over the topology's optional blocks: one generic reader (``fields.block_from_env``) and the
declared switches (``fields.Switch``) stand for the four hand-written readers env.py had (``_hfa_from_env``,
``_dgt_from_env``, ``_tsengine_from_env``, ``_security_from_env``).

The tables below are those readers' outcomes, recorded by running them on every case before they were deleted:
switch (its variable, or TSEngine's flag variables) x the topology's block x variables overriding its keys. The
one intended change is ``HFA_CHANGED``: with GEOMX_HFA unset, GEOMX_HFA_K1 / _K2 now apply to the topology's
``hfa`` block (the old reader ignored them), as every other block's variables do.

Usage: ``python -m pytest -q tests/unit/test_config_env_blocks.py``
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from geomx.config import (
    ENV_ALIASES,
    CheckpointSpec,
    ConfigError,
    DGTSpec,
    HFASpec,
    SecuritySpec,
    Timeouts,
    TSEngineSpec,
    node_config_from_env,
)
from geomx.config.env import NODE_VARIABLES, known_variables
from geomx.config.fields import Switch, block_from_env, switch_of


@dataclass(frozen=True)
class Refused:
    """An outcome that is a ConfigError with exactly this text."""

    text: str


# A table's outcome: None (no block), the fields that differ from the spec's defaults, or a refusal.
Outcome = None | dict[str, Any] | Refused

HFA_SWITCH = {"unset": {}, "empty": {"GEOMX_HFA": ""}, "off": {"GEOMX_HFA": "0"},
              "off-alias": {"MXNET_KVSTORE_USE_HFA": "False"}, "on": {"GEOMX_HFA": "1"},
              "on-alias": {"MXNET_KVSTORE_USE_HFA": "yes"},
              "ours-win": {"GEOMX_HFA": "0", "MXNET_KVSTORE_USE_HFA": "1"}, "bad": {"GEOMX_HFA": "maybe"}}
HFA_BASE = {"none": None, "block": HFASpec(2, 3)}
HFA_OVERRIDES = ({}, {"GEOMX_HFA_K1": "4"}, {"MXNET_KVSTORE_HFA_K2": "5"})  # the outcomes' order
HFA_BAD = Refused("GEOMX_HFA / MXNET_KVSTORE_USE_HFA must be 0 or 1, got 'maybe'")
HFA_BLOCK = {"k1": 2, "k2": 3}
HFA_TABLE: dict[tuple[str, str], tuple[Outcome, ...]] = {
    ("unset", "none"): (None, None, None),
    ("unset", "block"): (HFA_BLOCK, HFA_BLOCK, HFA_BLOCK),
    ("empty", "none"): (None, None, None),
    ("empty", "block"): (HFA_BLOCK, HFA_BLOCK, HFA_BLOCK),
    ("off", "none"): (None, None, None),
    ("off", "block"): (None, None, None),
    ("off-alias", "none"): (None, None, None),
    ("off-alias", "block"): (None, None, None),
    ("on", "none"): ({}, {"k1": 4}, {"k2": 5}),
    ("on", "block"): (HFA_BLOCK, {"k1": 4, "k2": 3}, {"k1": 2, "k2": 5}),
    ("on-alias", "none"): ({}, {"k1": 4}, {"k2": 5}),
    ("on-alias", "block"): (HFA_BLOCK, {"k1": 4, "k2": 3}, {"k1": 2, "k2": 5}),
    ("ours-win", "none"): (None, None, None),
    ("ours-win", "block"): (None, None, None),
    ("bad", "none"): (HFA_BAD, HFA_BAD, HFA_BAD),
    ("bad", "block"): (HFA_BAD, HFA_BAD, HFA_BAD),
}
# the intended change: GEOMX_HFA unset, the topology's block takes the variables' values
HFA_CHANGED: dict[tuple[str, str], tuple[Outcome, ...]] = {
    ("unset", "block"): (HFA_BLOCK, {"k1": 4, "k2": 3}, {"k1": 2, "k2": 5}),
    ("empty", "block"): (HFA_BLOCK, {"k1": 4, "k2": 3}, {"k1": 2, "k2": 5}),
}

DGT_SWITCH = {"unset": {}, "empty": {"GEOMX_DGT": ""}, "off": {"GEOMX_DGT": "0"}, "on-1": {"GEOMX_DGT": "1"},
              "on-2": {"GEOMX_DGT": "2"}, "on-alias": {"ENABLE_DGT": " 1"},
              "ours-win": {"GEOMX_DGT": "0", "ENABLE_DGT": "1"}, "mode-3": {"ENABLE_DGT": "3"},
              "bad": {"GEOMX_DGT": "true"}}
DGT_BASE = {"none": None, "block": DGTSpec(channels=2, k=0.5)}
DGT_OVERRIDES = ({}, {"DMLC_K": "0.6"}, {"GEOMX_DGT_CHANNELS": "4", "DGT_SET_RANDOM": "1"})


def _dgt_refused(value: str) -> Refused:
    return Refused("GEOMX_DGT / ENABLE_DGT must be 0, 1 or 2 (GeoMX's mode 3, 4-bit quantization of the unreliable "
                   f"blocks, is not supported), got {value!r}")


DGT_3, DGT_BAD = _dgt_refused("3"), _dgt_refused("true")
DGT_BLOCK: tuple[Outcome, ...] = ({"channels": 2, "k": 0.5}, {"channels": 2, "k": 0.6},
                                  {"channels": 4, "k": 0.5, "random_order": True})
DGT_DEFAULTS: tuple[Outcome, ...] = ({}, {"k": 0.6}, {"channels": 4, "random_order": True})
DGT_TABLE: dict[tuple[str, str], tuple[Outcome, ...]] = {
    ("unset", "none"): (None, None, None),
    ("unset", "block"): DGT_BLOCK,
    ("empty", "none"): (None, None, None),
    ("empty", "block"): DGT_BLOCK,
    ("off", "none"): (None, None, None),
    ("off", "block"): (None, None, None),
    ("on-1", "none"): DGT_DEFAULTS,
    ("on-1", "block"): DGT_BLOCK,
    ("on-2", "none"): DGT_DEFAULTS,
    ("on-2", "block"): DGT_BLOCK,
    ("on-alias", "none"): DGT_DEFAULTS,
    ("on-alias", "block"): DGT_BLOCK,
    ("ours-win", "none"): (None, None, None),
    ("ours-win", "block"): (None, None, None),
    ("mode-3", "none"): (DGT_3, DGT_3, DGT_3),
    ("mode-3", "block"): (DGT_3, DGT_3, DGT_3),
    ("bad", "none"): (DGT_BAD, DGT_BAD, DGT_BAD),
    ("bad", "block"): (DGT_BAD, DGT_BAD, DGT_BAD),
}

# TSEngine has no switch variable: its flags' variables switch it
TS_SWITCH = {"unset": {}, "inter-off": {"ENABLE_INTER_TS": "0"}, "inter-on": {"GEOMX_INTER_TS": "1"},
             "intra-on": {"ENABLE_INTRA_TS": "1"}, "intra-off": {"GEOMX_INTRA_TS": "0"},
             "both-off": {"GEOMX_INTER_TS": "0", "ENABLE_INTRA_TS": "0"},
             "both-on": {"ENABLE_INTER_TS": "1", "GEOMX_INTRA_TS": "1"}}
TS_BASE = {"none": None, "inter": TSEngineSpec(seed=3), "intra": TSEngineSpec(max_greed=0.5, inter=False, intra=True)}
TS_OVERRIDES = ({}, {"MAX_GREED_RATE_TS": "0.7"})
TS_INTER: tuple[Outcome, ...] = ({"seed": 3}, {"max_greed": 0.7, "seed": 3})
TS_INTRA: tuple[Outcome, ...] = ({"max_greed": 0.5, "inter": False, "intra": True},
                                 {"max_greed": 0.7, "inter": False, "intra": True})
TS_TABLE: dict[tuple[str, str], tuple[Outcome, ...]] = {
    ("unset", "none"): (None, None),
    ("unset", "inter"): TS_INTER,
    ("unset", "intra"): TS_INTRA,
    ("inter-off", "none"): (None, None),
    ("inter-off", "inter"): (None, None),
    ("inter-off", "intra"): TS_INTRA,
    ("inter-on", "none"): ({}, {"max_greed": 0.7}),
    ("inter-on", "inter"): TS_INTER,
    ("inter-on", "intra"): ({"max_greed": 0.5, "intra": True}, {"max_greed": 0.7, "intra": True}),
    ("intra-on", "none"): ({"inter": False, "intra": True}, {"max_greed": 0.7, "inter": False, "intra": True}),
    ("intra-on", "inter"): ({"seed": 3, "intra": True}, {"max_greed": 0.7, "seed": 3, "intra": True}),
    ("intra-on", "intra"): TS_INTRA,
    ("intra-off", "none"): (None, None),
    ("intra-off", "inter"): TS_INTER,
    ("intra-off", "intra"): (None, None),
    ("both-off", "none"): (None, None),
    ("both-off", "inter"): (None, None),
    ("both-off", "intra"): (None, None),
    ("both-on", "none"): ({"intra": True}, {"max_greed": 0.7, "intra": True}),
    ("both-on", "inter"): ({"seed": 3, "intra": True}, {"max_greed": 0.7, "seed": 3, "intra": True}),
    ("both-on", "intra"): ({"max_greed": 0.5, "intra": True}, {"max_greed": 0.7, "intra": True}),
}

BLOCKS = {  # spec: (switch cases, topology blocks, overrides, recorded outcomes)
    HFASpec: (HFA_SWITCH, HFA_BASE, HFA_OVERRIDES, {**HFA_TABLE, **HFA_CHANGED}),
    DGTSpec: (DGT_SWITCH, DGT_BASE, DGT_OVERRIDES, DGT_TABLE),
    TSEngineSpec: (TS_SWITCH, TS_BASE, TS_OVERRIDES, TS_TABLE),
}
CASES = [(cls, switch, base, index) for cls, (switches, bases, overrides, _) in BLOCKS.items()
         for switch, base, index in itertools.product(switches, bases, range(len(overrides)))]


def _outcome(cls: type, spec: Any) -> Outcome:
    """The table's form of a block: None, or its fields that differ from ``cls``'s defaults."""
    if spec is None:
        return None
    assert isinstance(spec, cls)
    default = cls()
    return {f.name: getattr(spec, f.name) for f in dataclasses.fields(cls) if getattr(spec, f.name) !=
            getattr(default, f.name)}


def _read(action: Any) -> Outcome:
    """``action()``'s outcome, a ConfigError as Refused."""
    try:
        return action()
    except ConfigError as exc:
        return Refused(str(exc))


def test_the_tables_cover_every_case() -> None:
    for switches, bases, overrides, table in BLOCKS.values():
        assert set(table) == set(itertools.product(switches, bases))
        assert {len(outcomes) for outcomes in table.values()} == {len(overrides)}


@pytest.mark.parametrize(("cls", "switch", "base", "index"), CASES,
                         ids=[f"{c.__name__}-{s}-{b}-{i}" for c, s, b, i in CASES])
def test_the_generic_reader_gives_what_the_hand_written_readers_gave(cls: type, switch: str, base: str,
                                                                     index: int) -> None:
    switches, bases, overrides, table = BLOCKS[cls]
    env = {**switches[switch], **overrides[index]}
    assert _read(lambda: _outcome(cls, block_from_env(cls, env, bases[base]))) == table[(switch, base)][index]


def test_the_intended_change_geomx_hfa_k1_applies_to_the_topologys_block(tmp_path: Path) -> None:
    # before, GEOMX_HFA_K1 was ignored unless GEOMX_HFA was set; now the topology's block takes it
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump({"parties": {"dc0": 1}, "hfa": {"k1": 2, "k2": 3}}))
    env = {"GEOMX_ROLE": "global_server", "GEOMX_PARTY": "dc0", "GEOMX_TOPOLOGY": str(path),
           "GEOMX_GLOBAL_SCHEDULER": "127.0.0.1:9"}
    assert node_config_from_env(env).topology.hfa == HFASpec(2, 3)
    assert node_config_from_env({**env, "GEOMX_HFA_K1": "4"}).topology.hfa == HFASpec(4, 3)
    assert node_config_from_env({**env, "MXNET_KVSTORE_HFA_K2": "5"}).topology.hfa == HFASpec(2, 5)
    assert node_config_from_env({**env, "GEOMX_HFA_K1": "4", "GEOMX_HFA": "0"}).topology.hfa is None
    path.write_text(yaml.safe_dump({"parties": {"dc0": 1}}))  # variables alone do not turn HFA on
    assert node_config_from_env({**env, "GEOMX_HFA_K1": "4"}).topology.hfa is None


# Security has no switch (the section is always there): GEOMX_SECRET, GEOMX_SECRET_FILE (the former wins) and
# GEOMX_CURVE_KEYS over the topology's block. Read end to end, through a topology file.
SECRET = {"unset": {}, "set": {"GEOMX_SECRET": "from-the-environment"}, "empty": {"GEOMX_SECRET": ""}}
SECRET_FILE = {"unset": None, "file": "secret.txt", "empty": "", "missing": "missing.txt", "short": "short.txt"}
SECURITY_BASE = {"default": None, "block": {"secret": "from-the-topology", "curve_keys": "/keys"}}
SECURITY_OVERRIDES = ({}, {"GEOMX_CURVE_KEYS": "/env-keys"})
MISSING = Refused("cannot read the shared secret from DIR/missing.txt: [Errno 2] No such file or directory: "
                  "'DIR/missing.txt'")
SHORT = Refused("GEOMX_SECRET_FILE: the shared secret must be at least 8 characters long")  # named by its variable
KEYS, ENV_KEYS = Path("/keys"), Path("/env-keys")
ENVIRONMENT, TOPOLOGY, FILE = "from-the-environment", "from-the-topology", "from-a-file-secret"
FROM_TOPOLOGY: tuple[Outcome, ...] = ({"secret": TOPOLOGY, "curve_keys": KEYS},
                                      {"secret": TOPOLOGY, "curve_keys": ENV_KEYS})
SECURITY_TABLE: dict[tuple[str, str, str], tuple[Outcome, ...]] = {
    ("unset", "unset", "default"): ({}, {"curve_keys": ENV_KEYS}),
    ("unset", "unset", "block"): FROM_TOPOLOGY,
    ("unset", "file", "default"): ({"secret": FILE}, {"secret": FILE, "curve_keys": ENV_KEYS}),
    ("unset", "file", "block"): ({"secret": FILE, "curve_keys": KEYS}, {"secret": FILE, "curve_keys": ENV_KEYS}),
    ("unset", "empty", "default"): ({}, {"curve_keys": ENV_KEYS}),
    ("unset", "empty", "block"): FROM_TOPOLOGY,
    ("unset", "missing", "default"): (MISSING, MISSING),
    ("unset", "missing", "block"): (MISSING, MISSING),
    ("unset", "short", "default"): (SHORT, SHORT),
    ("unset", "short", "block"): (SHORT, SHORT),
    ("set", "unset", "default"): ({"secret": ENVIRONMENT}, {"secret": ENVIRONMENT, "curve_keys": ENV_KEYS}),
    ("set", "unset", "block"): ({"secret": ENVIRONMENT, "curve_keys": KEYS},
                                {"secret": ENVIRONMENT, "curve_keys": ENV_KEYS}),
    ("set", "file", "default"): ({"secret": ENVIRONMENT}, {"secret": ENVIRONMENT, "curve_keys": ENV_KEYS}),
    ("set", "file", "block"): ({"secret": ENVIRONMENT, "curve_keys": KEYS},
                               {"secret": ENVIRONMENT, "curve_keys": ENV_KEYS}),
    ("set", "empty", "default"): ({"secret": ENVIRONMENT}, {"secret": ENVIRONMENT, "curve_keys": ENV_KEYS}),
    ("set", "empty", "block"): ({"secret": ENVIRONMENT, "curve_keys": KEYS},
                                {"secret": ENVIRONMENT, "curve_keys": ENV_KEYS}),
    ("set", "missing", "default"): ({"secret": ENVIRONMENT}, {"secret": ENVIRONMENT, "curve_keys": ENV_KEYS}),
    ("set", "missing", "block"): ({"secret": ENVIRONMENT, "curve_keys": KEYS},
                                  {"secret": ENVIRONMENT, "curve_keys": ENV_KEYS}),
    ("set", "short", "default"): ({"secret": ENVIRONMENT}, {"secret": ENVIRONMENT, "curve_keys": ENV_KEYS}),
    ("set", "short", "block"): ({"secret": ENVIRONMENT, "curve_keys": KEYS},
                                {"secret": ENVIRONMENT, "curve_keys": ENV_KEYS}),
    ("empty", "unset", "default"): ({}, {"curve_keys": ENV_KEYS}),
    ("empty", "unset", "block"): FROM_TOPOLOGY,
    ("empty", "file", "default"): ({"secret": FILE}, {"secret": FILE, "curve_keys": ENV_KEYS}),
    ("empty", "file", "block"): ({"secret": FILE, "curve_keys": KEYS}, {"secret": FILE, "curve_keys": ENV_KEYS}),
    ("empty", "empty", "default"): ({}, {"curve_keys": ENV_KEYS}),
    ("empty", "empty", "block"): FROM_TOPOLOGY,
    ("empty", "missing", "default"): (MISSING, MISSING),
    ("empty", "missing", "block"): (MISSING, MISSING),
    ("empty", "short", "default"): (SHORT, SHORT),
    ("empty", "short", "block"): (SHORT, SHORT),
}
SECURITY_CASES = [(*key, index) for key in SECURITY_TABLE for index in range(len(SECURITY_OVERRIDES))]


def test_the_security_table_covers_every_case() -> None:
    assert set(SECURITY_TABLE) == set(itertools.product(SECRET, SECRET_FILE, SECURITY_BASE))


@pytest.mark.parametrize(("secret", "secret_file", "base", "index"), SECURITY_CASES,
                         ids=[f"{s}-{f}-{b}-{i}" for s, f, b, i in SECURITY_CASES])
def test_the_security_variables_read_as_the_hand_written_reader_read_them(tmp_path: Path, secret: str,
                                                                          secret_file: str, base: str,
                                                                          index: int) -> None:
    (tmp_path / "secret.txt").write_text("  from-a-file-secret \n")
    (tmp_path / "short.txt").write_text("short\n")
    block = SECURITY_BASE[base]
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump({"parties": {"dc0": 1}, **({"security": block} if block else {})}))
    env = {"GEOMX_ROLE": "global_server", "GEOMX_PARTY": "dc0", "GEOMX_TOPOLOGY": str(path),
           "GEOMX_GLOBAL_SCHEDULER": "127.0.0.1:9", **SECRET[secret], **SECURITY_OVERRIDES[index]}
    name = SECRET_FILE[secret_file]
    if name is not None:
        env["GEOMX_SECRET_FILE"] = str(tmp_path / name) if name else ""
    outcome = _read(lambda: _outcome(SecuritySpec, node_config_from_env(env).topology.security))
    if isinstance(outcome, Refused):
        outcome = Refused(outcome.text.replace(str(tmp_path), "DIR"))
    assert outcome == SECURITY_TABLE[(secret, secret_file, base)][index]


def test_the_switches_are_declared_known_and_aliased() -> None:
    assert switch_of(HFASpec).env == "GEOMX_HFA" and switch_of(DGTSpec).env == "GEOMX_DGT"
    assert switch_of(TSEngineSpec).flags == ("inter", "intra") and switch_of(TSEngineSpec).env is None
    assert switch_of(Timeouts) == Switch()  # an always-present section is never switched
    assert ENV_ALIASES["GEOMX_HFA"] == ("MXNET_KVSTORE_USE_HFA",) and ENV_ALIASES["GEOMX_DGT"] == ("ENABLE_DGT",)
    assert {"GEOMX_HFA", "GEOMX_DGT", "GEOMX_SECRET_FILE"} <= known_variables()
    assert not {"GEOMX_HFA", "GEOMX_DGT", "GEOMX_SECRET_FILE"} & set(NODE_VARIABLES)  # declared, not by hand
    base = {"GEOMX_ROLE": "worker", "GEOMX_PARTY": "dc0", "GEOMX_GLOBAL_SCHEDULER": "127.0.0.1:1",
            "GEOMX_SCHEDULER": "127.0.0.1:2"}
    node = node_config_from_env({**base, "GEOMX_HFA": "0", "GEOMX_DGT": "0"})
    assert node.topology.training.plugin_options == ()  # known: not plug-in options


def test_a_spec_without_a_switch_takes_its_variables_over_its_section() -> None:
    checkpoint = CheckpointSpec(dir=Path("/c"), every_steps=5)
    assert block_from_env(CheckpointSpec, {}, checkpoint) == checkpoint
    assert block_from_env(CheckpointSpec, {"GEOMX_CHECKPOINT_EVERY_STEPS": "7"}, checkpoint) == \
        CheckpointSpec(dir=Path("/c"), every_steps=7)
    assert block_from_env(Timeouts, {"GEOMX_TIMEOUT": "5s"}, Timeouts()) == Timeouts(register_s=5, request_s=5,
                                                                                       round_s=5)


def test_every_variable_of_a_block_is_read_even_where_the_block_ends_up_off() -> None:
    # one rule: a bad value is refused whatever the switch says (it names the variable set, an alias here)
    with pytest.raises(ConfigError, match="MXNET_KVSTORE_HFA_K1 must be an integer, got 'x'"):
        block_from_env(HFASpec, {"GEOMX_HFA": "0", "MXNET_KVSTORE_HFA_K1": "x"}, None)
    with pytest.raises(ConfigError, match="DMLC_K must be a number, got 'x'"):
        block_from_env(DGTSpec, {"DMLC_K": "x"}, None)
