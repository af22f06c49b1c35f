"""The ONE table of features that do not combine, and the one function that checks a job against it.

Each row names two *facts* (short names of things a configuration may turn on: ``dgt``, ``hfa``, ``fp16``
...), the exact refusal text, and what to do instead. A fact is a yes/no the caller knows at its check point:
the topology knows its tiers and switches (``Topology.features``), CONFIGURE knows the codec and sync it was
sent (``configure_facts``), the torch wrapper's plan knows the training block, HFA and, once it has translated
the torch optimizer, whether a server optimizer answers with weights. A row fires only when the caller knows
both of its facts and both are true; rows are checked in table order, so the first refusal is the one that
would have been raised before this table existed.

Usage::

    check(topology.features)                              # raises ConfigError with the row's text
    check_training(topology.training, topology.hfa, synchronous=["dist_sync"], applies_on_server=False)
    text = refusal(configure_facts(topology.features, compression=True, other_sync=False))   # or None
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from .errors import ConfigError
from .specs import HFASpec, TrainingSpec

_README = "see docs/algorithms.md, 'Which features combine'"
DGT = "DGT (ENABLE_DGT)"
INTER_TS = "TSEngine (ENABLE_INTER_TS)"
INTRA_TS = "TSEngine inside a party (ENABLE_INTRA_TS)"
COLLECTIVE = "a collective LAN tier (lan: collective)"
_INTER_TS_CONFIGURE = f"{INTER_TS} works with dist_sync and without WAN compression; {_README}"


@dataclass(frozen=True)
class Rule:
    """Facts ``feature`` and ``other`` true together are refused with ``text`` (``str.format``-ed with the
    caller's values); ``instead`` says what works."""

    feature: str
    other: str
    text: str
    instead: str


def _no(feature: str, what: str) -> str:
    return f"{feature} does not combine with {what}; {_README}"


RULES: tuple[Rule, ...] = (
    # the topology (Topology.__post_init__)
    Rule("dgt", "flat", _no(DGT, "a flat parameter server (DGT is for local servers' pushes)"), "mode: hips"),
    Rule("dgt", "hfa", _no(DGT, "HFA"), "drop one of dgt and hfa"),
    # (under mode: flat each worker's param / party workers reached the global sum: the model doubled every round)
    Rule("hfa", "flat", _no("HFA (and ESync)", "a flat parameter server (a party's average is its local server's)"),
         "mode: hips"),
    Rule("dgt", "fp16", _no(DGT, "the fp16 switch"), "fp16: false"),
    Rule("dgt", "security", _no(DGT, "security (UDP datagrams are not authenticated)"), "no secret or CURVE keys"),
    Rule("inter_ts", "flat", _no(INTER_TS, "a flat parameter server (there are no local servers to relay)"),
         "mode: hips"),
    Rule("inter_ts", "hfa", _no(INTER_TS, "HFA"), "drop one of tsengine.inter and hfa"),
    Rule("inter_ts", "fp16", _no(INTER_TS, "the fp16 switch"), "fp16: false"),
    Rule("inter_ts", "dgt", _no(INTER_TS, "DGT"), "drop one of tsengine.inter and dgt"),
    Rule("intra_ts", "flat", _no(INTRA_TS, "a flat parameter server (there is no local server)"), "mode: hips"),
    Rule("intra_ts", "fp16", _no(INTRA_TS, "the fp16 switch (relays carry float32)"), "fp16: false"),
    Rule("collective", "flat", _no(COLLECTIVE, "a flat parameter server (mode: flat has no LAN tier)"),
         "mode: hips"),
    Rule("collective", "dgt", _no(COLLECTIVE, "DGT (its UDP channels start at local servers)"), "no dgt"),
    Rule("collective", "inter_ts", _no(COLLECTIVE, "TSEngine (its relays run between servers)"), "no tsengine"),
    Rule("collective", "intra_ts", _no(COLLECTIVE, "TSEngine inside a party"), "no tsengine"),
    Rule("collective", "fp16", _no(COLLECTIVE, "the fp16 switch yet (for float16 on the WAN set training.compression: "
                                            "fp16: each rank encodes the slices it owns)"),
         "fp16: false; training.compression: fp16"),
    # a CONFIGURE request to the servers (server._on_configure)
    Rule("inter_ts", "wan_compression", _INTER_TS_CONFIGURE, "no training.compression under TSEngine"),
    Rule("inter_ts", "other_sync", _INTER_TS_CONFIGURE, "training.sync: dist_sync"),
    Rule("dgt", "wan_compression", _no(DGT, "WAN compression"), "no training.compression under DGT"),
    # the torch wrapper's plan (torch/plan.make_plan), before the torch optimizer is translated
    Rule("esync", "no_hfa_k2_1", "ESync runs on HFA with K2 = 1: add `hfa: {{k1: 4, k2: 1}}` to the topology",
         "hfa: {k1: 4, k2: 1}"),
    Rule("hfa", "asynchronous_sync", "HFA and ESync average models synchronously: training.sync {sync} is not; "
         "use one of {synchronous}", "training.sync: dist_sync"),
    Rule("hfa", "weights_optimizer", "under HFA the global server sees model deltas: server optimizer "
         "{server_optimizer!r} does not apply; use outer_nesterov, sgd or none", "outer_nesterov, sgd or none"),
    Rule("outer_nesterov", "no_hfa", "the outer Nesterov optimizer needs HFA: add `hfa: {{k1: ..., k2: ...}}` to "
         "the topology", "hfa: {k1: ..., k2: ...}"),
    # ... and after (facts known only then)
    Rule("residual_codec", "server_optimizer", "codec {codec!r} keeps residuals and needs additive data, but a "
         "server optimizer answers with weights: set training.server_optimizer to none",
         "training.server_optimizer: none"),
    Rule("applies_on_server", "no_server_optimizer", "{policy} ({sync}) answers a party with a model its own "
         "gradient may not be part of yet, so the global server must apply the gradients: it needs a server "
         "optimizer, but {why}", "training.server_optimizer: sgd, adam or dcasgd"),
)

# Server optimizers that apply a gradient rule to what they receive: wrong on HFA's model deltas.
WEIGHTS_OPTIMIZERS = ("adam", "dcasgd", "dcadam")


def refusal(facts: Mapping[str, bool], **values: object) -> str | None:
    """The text of the first row whose two facts are both known and true (``values`` fill its blanks)."""
    for rule in RULES:
        if facts.get(rule.feature) and facts.get(rule.other):
            return rule.text.format(**values)
    return None


def check(facts: Mapping[str, bool], **values: object) -> None:
    """Raise ConfigError with the first row ``facts`` break (see ``refusal``)."""
    text = refusal(facts, **values)
    if text is not None:
        raise ConfigError(text)


def configure_facts(features: Mapping[str, bool], *, compression: bool, other_sync: bool) -> dict[str, bool]:
    """What a CONFIGURE request sets (a WAN codec; a sync other than dist_sync) over the topology's ``features``."""
    return {**features, "wan_compression": compression, "other_sync": other_sync}


def plan_facts(spec: TrainingSpec, hfa: HFASpec | None, residual_codec: bool, *, synchronous: bool,
               applies_on_server: bool) -> dict[str, bool]:
    """What the torch wrapper's training block and HFA turn on, before the torch optimizer is translated;
    ``synchronous`` and ``applies_on_server`` are what the chosen sync policy declares (the caller asks it)."""
    return {"esync": spec.esync, "no_hfa_k2_1": hfa is None or hfa.k2 != 1, "hfa": hfa is not None,
            "no_hfa": hfa is None, "asynchronous_sync": not synchronous,
            "weights_optimizer": spec.server_optimizer in WEIGHTS_OPTIMIZERS,
            "outer_nesterov": spec.server_optimizer == "outer_nesterov", "residual_codec": residual_codec,
            "applies_on_server": applies_on_server}


def check_training(spec: TrainingSpec, hfa: HFASpec | None, *, synchronous: Collection[str], applies_on_server: bool,
                   residual_codec: bool = False) -> dict[str, bool]:
    """Check the torch wrapper's rows that need no torch optimizer (ESync without HFA's K2 = 1, HFA under an
    asynchronous sync, ...) and return the facts, for the rows ``make_plan`` checks once it has translated the
    optimizer. ``geomx launch`` calls this before starting any process, so a job that cannot run is refused there,
    once, not by every worker after the job has started; ``make_plan`` calls it again (a rank started by hand).

    The sync registry is not config's to import: ``synchronous`` names the sync policies that declare themselves
    synchronous, ``applies_on_server`` is what ``spec.sync``'s policy declares (``needs_server_optimizer``),
    ``residual_codec`` whether the codec keeps residuals (read only by the rows checked after translation).
    """
    facts = plan_facts(spec, hfa, residual_codec, synchronous=spec.sync in synchronous,
                       applies_on_server=applies_on_server)
    check(facts, server_optimizer=spec.server_optimizer, sync=spec.sync, synchronous=sorted(synchronous))
    return facts
