"""Config declared once (geomx.config.fields): every field of every feature spec declares its YAML key, environment
name and kind, and round-trips YAML -> spec -> YAML -> spec and environment -> spec -> environment.

A field added to a spec without its metadata fails ``test_every_field_is_declared``; a kind that cannot write
back what it reads fails the round trips (Hypothesis draws the values).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from geomx.config import (
    ENV_ALIASES,
    CheckpointSpec,
    ConfigError,
    DGTSpec,
    HFASpec,
    SecuritySpec,
    Timeouts,
    TrainingSpec,
    TSEngineSpec,
    fields,
    kinds,
    node_config_from_env,
    topology_from_dict,
    topology_to_dict,
)
from geomx.config.env import ENV_SPECS
from geomx.launch import launch

SPECS = (Timeouts, HFASpec, DGTSpec, TSEngineSpec, TrainingSpec, SecuritySpec, CheckpointSpec)
NAMES = st.text("abcdefghijklmnopqrstuvwxyz0123456789_", min_size=1, max_size=12)
NUMBER = st.floats(0.01, 1.0, allow_nan=False)
STRATEGIES = {
    kinds.INT: st.sampled_from([1, 2, 3, 4, 8, 4096, 100_000]),
    kinds.FLOAT: NUMBER,
    kinds.BOOL: st.booleans(),
    kinds.STR: st.text("abcdefghijklmnopqrstuvwxyz0123456789_-", min_size=8, max_size=20),
    kinds.DURATION: st.floats(0.001, 1e4, allow_nan=False),
    kinds.BANDWIDTH: st.floats(1.0, 1e12, allow_nan=False),
    kinds.FLOATS: st.lists(st.floats(0.0, 0.99, allow_nan=False), max_size=3).map(tuple),
    kinds.PATH: NAMES.map(lambda name: Path("/tmp") / name),
    kinds.OPTIMIZER: st.tuples(NAMES, st.lists(st.tuples(NAMES, NUMBER), max_size=3, unique_by=lambda kv: kv[0])
                               .map(tuple)),
    kinds.CODEC: st.builds(lambda name, params: {"type": name, **params}, NAMES,
                           st.dictionaries(NAMES.filter(lambda k: k != "type"), NUMBER, max_size=3)),
}


def _strategy(kind: kinds.ValueKind) -> st.SearchStrategy:
    return next(strategy for known, strategy in STRATEGIES.items() if known.from_text is kind.from_text)


@st.composite
def specs(draw: st.DrawFn, cls: type) -> object:
    """A valid ``cls`` with every declared field drawn (fields sharing a variable drawn once)."""
    values: dict[str, object] = {}
    by_env: dict[str, object] = {}
    for name, declared in fields.settings(cls):
        value = by_env[declared.env] if declared.env in by_env else draw(_strategy(declared.kind))
        if declared.env:
            by_env[declared.env] = value
        if declared.companions:
            values.update(dict(zip((name, *declared.companions), value, strict=True)))
        else:
            values[name] = value
    try:
        return cls(**values)
    except ConfigError:
        assume(False)
        raise


@pytest.mark.parametrize("cls", SPECS, ids=lambda c: c.__name__)
def test_every_field_is_declared(cls):
    assert fields.undeclared(cls) == []
    declared = dict(fields.settings(cls))
    assert len({d.key for d in declared.values()}) == len(declared)  # one key per field


@pytest.mark.parametrize("cls", ENV_SPECS, ids=lambda c: c.__name__)
def test_every_declared_setting_says_what_it_does(cls):
    # the reference's "meaning" column (docs/configuration.md) shows each doc; "—" there is a missing one
    assert [name for name, d in fields.settings(cls) if not d.doc.strip()] == []
    switch = fields.switch_of(cls)
    assert not switch.env or switch.doc.strip(), f"{cls.__name__}'s switch {switch.env} has no doc"


@pytest.mark.parametrize("cls", SPECS, ids=lambda c: c.__name__)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(data=st.data())
def test_yaml_round_trip(cls, data):
    spec = data.draw(specs(cls))
    written = yaml.safe_load(yaml.safe_dump(fields.to_mapping(spec)))  # through a real YAML text
    read = fields.read_mapping(cls, written, "section")
    hidden = {name: getattr(spec, name) for name, d in fields.settings(cls) if not d.written}
    assert cls(**{**read, **hidden}) == spec


@pytest.mark.parametrize("cls", SPECS, ids=lambda c: c.__name__)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(data=st.data())
def test_environment_round_trip(cls, data):
    spec = data.draw(specs(cls))
    env = fields.to_env(spec)
    with_env = [n for name, d in fields.settings(cls) if d.env for n in (name, *d.companions)]
    assert set(env) == {d.env for _, d in fields.settings(cls) if d.env}
    # the fields without a variable keep their defaults
    assert dataclasses.replace(cls(), **fields.env_values(cls, env)) == \
        dataclasses.replace(cls(), **{name: getattr(spec, name) for name in with_env})
    assert fields.to_env(dataclasses.replace(cls(), **fields.env_values(cls, env))) == env


GEOMX_NAMES = {  # GeoMX's documented names of feature settings (its README and configuration guide)
    "MXNET_KVSTORE_SIZE_LOWER_BOUND", "ENABLE_INTRA_TS", "ENABLE_INTER_TS", "MXNET_KVSTORE_HFA_K1", "MAX_GREED_RATE_TS",
    "ADAPTIVE_K_FLAG", "ENABLE_P3", "DMLC_UDP_CHANNEL_NUM", "DMLC_K", "MXNET_KVSTORE_HFA_K2", "DMLC_K_MIN",
    "DGT_SET_RANDOM", "DGT_CONTRIBUTION_ALPHA", "DGT_BLOCK_SIZE"}
SAMPLE_TEXT = {kinds.INT.from_text: "4", kinds.FLOAT.from_text: "0.5", kinds.BOOL.from_text: "1"}


def test_geomx_aliases_are_declared_read_and_the_canonical_name_wins():
    declared = [(cls, name, d) for cls in ENV_SPECS for name, d in fields.settings(cls) if d.aliases]
    assert {alias for _, _, d in declared for alias in d.aliases} == GEOMX_NAMES
    for cls, name, d in declared:
        assert ENV_ALIASES[d.env] == d.aliases
        text = SAMPLE_TEXT[d.kind.from_text]
        via_alias = fields.env_values(cls, {d.aliases[0]: text})
        assert via_alias == fields.env_values(cls, {d.env: text}) == {name: d.kind.from_text(text, d.env)}
    assert fields.env_values(HFASpec, {"MXNET_KVSTORE_HFA_K1": "4", "GEOMX_HFA_K1": "6"}) == {"k1": 6}
    assert fields.env_values(HFASpec, {"MXNET_KVSTORE_HFA_K1": "4", "GEOMX_HFA_K1": ""}) == {"k1": 4}


@pytest.mark.parametrize(("cls", "raw", "text"), [
    (HFASpec, {"k1": 2, "k3": 1}, r"hfa has unknown fields \['k3'\]; allowed: \['k1', 'k2'\]"),
    (HFASpec, {"k1": "two"}, r"hfa\.k1 must be an integer, got 'two'"),
    (DGTSpec, {"k": True}, r"dgt\.k must be a number, got True"),
    (TrainingSpec, {"esync": 1}, r"training\.esync must be bool, got 1"),
    (DGTSpec, {"rate": "fast"}, "cannot read bandwidth 'fast'"),
    (CheckpointSpec, [1], r"checkpoint must be a mapping with some of \['dir', 'every_seconds', 'every_steps', "),
])
def test_bad_yaml_names_the_key_the_value_and_what_is_expected(cls, raw, text):
    section = {HFASpec: "hfa", DGTSpec: "dgt", TrainingSpec: "training", CheckpointSpec: "checkpoint"}[cls]
    with pytest.raises(ConfigError, match=text):
        fields.read_mapping(cls, raw, section)


def test_a_section_with_an_extras_field_collects_the_keys_it_does_not_declare():
    @dataclasses.dataclass(frozen=True)
    class WithOptions:
        k: int = fields.setting(1, kind=kinds.INT)
        options: tuple[tuple[str, str], ...] = fields.extras()

    assert fields.undeclared(WithOptions) == []
    values = fields.read_mapping(WithOptions, {"k": 2, "staleness": 3, "bound": "x"}, "training")
    assert values == {"k": 2, "options": (("bound", "x"), ("staleness", "3"))}
    assert fields.read_mapping(WithOptions, {"k": 2}, "training") == {"k": 2}
    written = fields.to_mapping(WithOptions(**values))  # written back with the topology a launcher passes on
    assert WithOptions(**fields.read_mapping(WithOptions, written, "training")) == WithOptions(**values)
    with pytest.raises(ConfigError, match=r"hfa has unknown fields \['staleness'\]"):  # without one: refused
        fields.read_mapping(HFASpec, {"k1": 2, "staleness": 3}, "hfa")


def test_a_misspelt_field_with_a_mapping_is_named_as_a_misspelt_field_not_a_bad_plug_in_option():
    # a plug-in option is a scalar, so {type: fp16} under an unknown key can only be a field spelt wrong
    with pytest.raises(ConfigError, match=r"training has an unknown field 'compresion'; did you mean 'compression'\?"):
        fields.read_mapping(TrainingSpec, {"compresion": {"type": "fp16"}}, "training")
    with pytest.raises(ConfigError, match=r"unknown field 'p3_slices'; did you mean 'p3_slice_elems'\?"):
        fields.read_mapping(TrainingSpec, {"p3_slices": [1, 2]}, "training")
    with pytest.raises(ConfigError, match=r"unknown field 'zzz' \(not a plug-in option"):  # nothing close
        fields.read_mapping(TrainingSpec, {"zzz": {}}, "training")


def test_bad_environment_text_names_the_variable_set():
    with pytest.raises(ConfigError, match=r"DMLC_UDP_CHANNEL_NUM must be an integer, got 'three'"):
        fields.env_values(DGTSpec, {"DMLC_UDP_CHANNEL_NUM": "three"})
    with pytest.raises(ConfigError, match=r"ADAPTIVE_K_FLAG must be 0 or 1, got 'maybe'"):
        fields.env_values(DGTSpec, {"ADAPTIVE_K_FLAG": "maybe"})


def test_a_whole_topology_round_trips_with_every_section():
    topology = topology_from_dict({
        "parties": {"dc0": 2, "dc1": 1}, "hfa": {"k1": 2, "k2": 3}, "elastic": True, "size_lower_bound": 10,
        "training": {"tensorboard": True, "server_optimizer": "outer_nesterov:lr=0.7", "compression": "fp16"},
        "checkpoint": {"dir": "/tmp/ckpt", "every_seconds": "120s"}, "timeouts": {"heartbeat": "20s"},
        "tsengine": {"intra": True, "inter": False, "max_greed": 0.5}})
    assert topology_from_dict(yaml.safe_load(yaml.safe_dump(topology_to_dict(topology)))) == topology


def test_names_are_checked_against_the_registries_at_launch(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("parties: {dc0: 1}\ntraining: {sync: dist_ssp_v9}\n")
    with pytest.raises(ConfigError, match=r"training\.sync 'dist_ssp_v9' is unknown; valid: \['dist_async', "):
        launch(path, ["true"], run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()  # refused before anything started


def test_the_environment_reaches_every_spec(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("parties: {dc0: 1}\n")
    env = {"GEOMX_ROLE": "global_server", "GEOMX_PARTY": "dc0", "GEOMX_TOPOLOGY": str(path),
           "GEOMX_GLOBAL_SCHEDULER": "127.0.0.1:9", "MXNET_KVSTORE_SIZE_LOWER_BOUND": "77", "GEOMX_ELASTIC": "1",
           "GEOMX_TIMEOUT": "7s", "GEOMX_CHECKPOINT_DIR": "/tmp/c", "GEOMX_CHECKPOINT_EVERY_STEPS": "3",
           "GEOMX_METRICS_EVERY": "4", "GEOMX_CURVE_KEYS": "/tmp/keys"}
    topology = node_config_from_env(env).topology
    assert (topology.size_lower_bound, topology.elastic, topology.timeouts.round_s) == (77, True, 7.0)
    assert topology.checkpoint == CheckpointSpec(dir=Path("/tmp/c"), every_steps=3)
    assert topology.training.metrics_every == 4 and topology.security.curve_keys == Path("/tmp/keys")


def _documented(readme: str) -> set[str]:
    """The GEOMX_* names a page gives, ``GEOMX_A_B`` / ``_C`` shorthand expanded to ``GEOMX_A_C``."""
    import re

    names = set(re.findall(r"\bGEOMX_[A-Z0-9_]*[A-Z0-9]", readme))
    for first, rest in re.findall(r"`(GEOMX_[A-Z0-9_]+)`((?: / `_[A-Z0-9_]+`)+)", readme):
        prefix = first.rsplit("_", 1)[0]
        names |= {prefix + suffix for suffix in re.findall(r"`(_[A-Z0-9_]+)`", rest)}
    return names


def test_the_docs_name_exactly_the_variables_the_config_reads():
    import re

    from geomx.config import env as env_module

    read = set(env_module.known_variables())  # declared (fields, file variables, switches) and by hand
    assert {"GEOMX_HFA", "GEOMX_DGT", "GEOMX_SECRET_FILE"} <= read
    source = Path(env_module.__file__).read_text()
    assert set(re.findall(r'"(GEOMX_[A-Z0-9_]+)"', source)) <= read  # no variable read by hand but unlisted
    docs = Path(__file__).parents[2] / "docs"
    assert _documented((docs / "configuration.md").read_text()) == read  # the generated reference
    # plug-in options are read generically (GEOMX_<NAME> nothing else reads): the algorithms' page names the
    # ones the registered plug-ins declare
    from geomx.algorithms.registry import AGGREGATIONS, SYNC_POLICIES

    options = {f"GEOMX_{name.upper()}" for cls in (*SYNC_POLICIES.values(), *AGGREGATIONS.values())
               for name in cls.options}
    assert options <= _documented((docs / "algorithms.md").read_text())


@settings(max_examples=100, deadline=None)
@given(value=st.floats(1e-3, 1e6, allow_nan=False), unit=st.sampled_from([("k", 1e3), ("M", 1e6), ("G", 1e9)]),
       written=st.sampled_from(["{v}{u}bit", "{v} {u}bit/s", "{v}{u}bps", "{v}{u}B"]))
def test_bandwidths_read_as_written(value, unit, written):
    prefix, scale = unit
    expected = value * scale * (8 if written.endswith("B") else 1)
    assert kinds.BANDWIDTH.from_text(written.format(v=repr(value), u=prefix), "rate") == pytest.approx(expected)
    assert kinds.BANDWIDTH.from_text(kinds.BANDWIDTH.to_text(expected), "rate") == expected


@settings(max_examples=100, deadline=None)
@given(value=st.floats(0, 1e5, allow_nan=False), unit=st.sampled_from([("us", 1e-6), ("ms", 1e-3), ("s", 1.0)]))
def test_durations_read_as_written(value, unit):
    suffix, scale = unit
    assert kinds.DURATION.from_yaml(f"{value!r}{suffix}", "timeouts.round", None) == pytest.approx(value * scale)
    assert kinds.DURATION.from_text(kinds.DURATION.to_text(value), "GEOMX_TIMEOUT") == value


def test_a_parameter_called_type_is_refused_where_it_would_take_the_names_place():
    # written back, a spec is {type: name, **params}: a parameter "type" would overwrite the name (hypothesis found
    # server_optimizer '0' with a parameter type=1.0, which read back as a spec with no name)
    with pytest.raises(ConfigError, match="no parameter may be called that"):
        TrainingSpec(server_optimizer="dcasgd", server_optimizer_params=(("type", 1.0),))
    with pytest.raises(ConfigError, match="no parameter may be called that"):
        kinds.named_spec("dcasgd:lamda=0.04,type=1", "training.server_optimizer")
    assert kinds.named_spec("dcasgd:lamda=0.04", "x") == ("dcasgd", {"lamda": 0.04})
