"""The configuration reference, generated from the typed settings: every topology key and environment variable.

Each feature spec declares its fields once (``geomx.config.fields.setting``: YAML key, ``GEOMX_*`` variable,
GeoMX alias, kind, help), and an optional block its switch (``fields.Switch``); this module walks those
declarations and writes them as Markdown tables, so the published reference cannot drift from what the
configuration reads. ``tests/unit/test_docs.py`` fails when ``docs/configuration.md`` differs from what this module
generates.

Usage::

    python -m geomx.config.reference > docs/configuration.md      # regenerate the page
    python -m geomx.config.reference --check docs/configuration.md   # exit 1 if the page is stale
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import sys
from collections.abc import Iterator
from pathlib import Path

from .env import ENV_ALIASES, ENV_SPECS, NODE_VARIABLES
from .fields import Setting, Switch, settings, switch_of
from .specs import CheckpointSpec, DGTSpec, HFASpec, SecuritySpec, Timeouts, TrainingSpec, TSEngineSpec
from .status import StatusSpec
from .topology import LAN_SLICE_ELEMS, WAN_SLICE_ELEMS, Topology

COMMAND = "python -m geomx.config.reference > docs/configuration.md"

# The topology file's sections, in the order a topology file usually lists them: (YAML section, spec).
# "" is the top level. Every spec the environment may set must have a section here (checked in ``markdown``).
SECTIONS: tuple[tuple[str, type], ...] = (
    ("", Topology),
    ("timeouts", Timeouts),
    ("training", TrainingSpec),
    ("hfa", HFASpec),
    ("dgt", DGTSpec),
    ("tsengine", TSEngineSpec),
    ("security", SecuritySpec),
    ("checkpoint", CheckpointSpec),
    ("status", StatusSpec),
)

# What a section's YAML allows beyond its keys (read by hand in geomx.config.yaml_io); how the environment switches
# an optional block is written from its spec's Switch (``_switch_rule``).
_SECTION_NOTES: dict[str, str] = {
    "hfa": "The block turns HFA on (`hfa: false` or none: off).",
    "dgt": "`dgt: true` or any of its keys turns DGT on.",
    "tsengine": "`tsengine: true` or the block turns TSEngine on; with both `inter` and `intra` false it is off.",
    "status": "`status: false` turns the page off; `status: true` or none: on, at 127.0.0.1 and a free port.",
    "security": "`secret_file: PATH` may stand for `secret` (as `GEOMX_SECRET_FILE` may for `GEOMX_SECRET`).",
    "training": "Keys no field declares are plug-in options, handed to the algorithm that declares them "
                "(`staleness`, `fragments`, `fragment_delay`, `fragment_alpha`, `quorum`, `grace`, `stale_rounds`: see "
                "[algorithms](algorithms.md)); "
                "so are `GEOMX_<NAME>` variables nothing else reads.",
}

# Top-level keys read by hand in geomx.config.yaml_io (they have structure, not one value).
_HAND_READ_KEYS: tuple[tuple[str, str, str], ...] = (
    ("parties", "required",
     "each data center (party) and its workers (`{dc0: {workers: 2}, dc1: 2}`); optional per party: "
     "`wan: {bandwidth, latency}` (its own WAN link; between two parties the slower one counts) and "
     "`access: 50Mbit` (its own connection to the WAN)"),
    ("central", "the first party", "the party that hosts the global scheduler and the global servers"),
    ("mode", "`hips`", "`hips` (local servers, two tiers) or `flat` (every worker talks to the global servers)"),
    ("links", "unlimited, 0 ms",
     "`lan:` and `wan:` `{bandwidth: 100Mbit, latency: 25ms}`; `lan` also takes `ingress: true` (nodes receive "
     "at the link rate too)"),
    ("slice_elems", f"{WAN_SLICE_ELEMS:,} with several parties, {LAN_SLICE_ELEMS:,} with one",
     "tensors larger than this travel as independent slices"),
    ("outages", "none",
     "`[{party: dc1, start: 20s, duration: 5s, from: launch}]`: emulated WAN cut-offs (`from: training` counts "
     "from each process's first training message)"),
)

# Variables read by hand in geomx.config.env: a process's role and addresses, mostly set by `geomx launch`.
_PROCESS_HELP: dict[str, str] = {
    "GEOMX_ROLE": "global_scheduler, global_server, local_scheduler, local_server or worker "
                  "(GeoMX: `DMLC_ROLE` with `DMLC_ROLE_GLOBAL`)",
    "GEOMX_PARTY": "this process's party",
    "GEOMX_TOPOLOGY": "the topology file",
    "GEOMX_SCHEDULER": "this party's local scheduler, HOST:PORT (GeoMX: `DMLC_PS_ROOT_URI` + `DMLC_PS_ROOT_PORT`)",
    "GEOMX_GLOBAL_SCHEDULER": "the global scheduler, HOST:PORT "
                              "(GeoMX: `DMLC_PS_GLOBAL_ROOT_URI` + `DMLC_PS_GLOBAL_ROOT_PORT`)",
    "GEOMX_NUM_WORKERS": "workers in this party (without a topology file)",
    "GEOMX_NUM_GLOBAL_SERVERS": "global servers (without a topology file); set it on every process, workers too "
                                "(they place the slices; GeoMX's `DMLC_NUM_SERVER` is not read)",
    "GEOMX_NUM_ALL_WORKERS": "workers in all parties (without a topology file)",
    "GEOMX_NUM_PARTIES": "local servers that register with the global scheduler (without a topology file)",
    "GEOMX_CENTRAL": "the central party (without a topology file)",
    "GEOMX_MASTER_WORKER": "`1`: this worker is the master worker",
    "GEOMX_RANK": "requested rank (a worker's in its party, a global server's shard id)",
    "GEOMX_HOST": "address to bind and announce",
    "GEOMX_WORKER_OFFSET": "global rank of this party's first worker (without a topology file)",
    "GEOMX_RUN_DIR": "where stats, metrics and reports go",
    "GEOMX_RESUME": "`1`: the job resumes from its newest valid checkpoint, its global servers and its workers "
                    "(`geomx launch --resume`)",
    "GEOMX_JOB_START": "wall-clock time (`time.time()`) that `outages` count from (`geomx launch` sets it)",
    "GEOMX_TRACE": "`1`: every node writes a message timeline to `RUN/trace/` (debugging only)",
    "GEOMX_LAN": "`server` or `collective`: every party's LAN tier, over the topology's `lan` (see "
                 "docs/collective.md); a collective party's ranks also read torchrun's `RANK`, `WORLD_SIZE`, "
                 "`LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`",
}


def _code(text: str) -> str:
    return f"`{text}`"


def _bandwidth(bps: float) -> str:
    for unit, scale in (("Gbit", 1e9), ("Mbit", 1e6), ("kbit", 1e3)):
        if bps >= scale:
            return f"{bps / scale:g}{unit}"
    return f"{bps:g}bit"


def _default(spec: type, name: str, declared: Setting) -> str:
    """The field's default as a topology file would write it."""
    value = next(f.default for f in dataclasses.fields(spec) if f.name == name)
    if value is dataclasses.MISSING or value is None or value == ():
        return "unset"
    if isinstance(value, bool):
        return _code(str(value).lower())
    if declared.kind.expects.startswith("a duration"):
        return _code(f"{value * 1000:g}ms" if 0 < value < 1 else f"{value:g}s")
    if declared.kind.expects.startswith("a bandwidth"):
        return _code(_bandwidth(value))
    if isinstance(value, int):
        return _code(f"{value}")
    return _code(str(value))


def _help(spec: type) -> str:
    """A spec's docstring as one Markdown paragraph (reST's double backticks made single, usage lines left out)."""
    text = inspect.getdoc(spec) or ""
    kept = [p for p in text.split("\n\n") if not p.lstrip().startswith("Usage") and not p.startswith(" ")]
    prose = " ".join(" ".join(p.split()) for p in kept).replace("``", "`")
    return prose.split(" Usage: ")[0].split(" Topology form::")[0]


def _cell(text: str) -> str:
    return text.replace("|", "\\|") or "—"


def _switch_rule(switch: Switch) -> str:
    """How the environment switches a block (the rule of ``fields.block_from_env``), in words ("" when it has no
    switch)."""
    if not (switch.env or switch.flags):
        return ""
    unset = "not set" if switch.env else "none set"
    tail = (f"the block (or, without one, the defaults) with the variables below; {unset}, the variables below apply "
            "to the topology's block if it has one (they do not turn a block on).")
    if switch.env:
        return f"From the environment: `{switch.env}` off drops the block, whatever the topology says; on gives {tail}"
    flags = " and ".join(_code(flag) for flag in switch.flags)
    return (f"From the environment: the variables of {flags} switch the block (a flag not set keeps the block's "
            "value, off without one): all off drops it, whatever the topology says; any on gives " + tail)


def _rows(section: str, spec: type) -> Iterator[str]:
    yield "| key | environment | GeoMX alias | value | default | meaning |"
    yield "|---|---|---|---|---|---|"
    switch = switch_of(spec)
    if switch.env:
        aliases = ", ".join(_code(alias) for alias in switch.aliases) or "—"
        yield (f"| {_code(section)} | {_code(switch.env)} | {aliases} | {_cell(switch.expects)} | unset | "
               f"{_cell(switch.doc)} |")
    for name, declared in settings(spec):
        key = f"{section}.{declared.key}" if section else declared.key
        env = _code(declared.env) if declared.env else "—"
        if declared.file_env:
            env += f", or a file: {_code(declared.file_env)}"
        aliases = ", ".join(_code(alias) for alias in declared.aliases) or "—"
        yield (f"| {_code(key)} | {env} | {aliases} | {_cell(declared.kind.expects)} | "
               f"{_default(spec, name, declared)} | {_cell(declared.doc)} |")


def markdown() -> str:
    """The whole reference page, as Markdown."""
    missing = [cls.__name__ for cls in ENV_SPECS if cls not in {spec for _, spec in SECTIONS}]
    if missing:
        raise RuntimeError(f"geomx.config.reference.SECTIONS lacks {missing}: add their YAML sections")
    lines = [
        "# Configuration reference",
        "",
        f"Generated from the typed settings in `src/geomx/config` by `{COMMAND}`; do not edit by hand "
        "(a test fails when this page is stale).",
        "",
        "Every setting has a key in the topology file and most have an environment variable; the variable wins "
        "over the file, and a GeoMX alias works where `GEOMX_*` is not set. `geomx launch` passes the "
        "topology to every process; set variables only to override it or to start processes by hand "
        "([deployment](deployment.md)). Durations read `100us`, `25ms`, `1.5s`, `2m` (or `2min`), `1h` (a bare "
        "number is seconds); "
        "bandwidths `100Mbit`, `1Gbit`, `10MB` (bytes per second).",
        "",
        "```yaml",
        "parties: {dc0: {workers: 2}, dc1: {workers: 2}}",
        "central: dc0",
        "links: {lan: {bandwidth: 10Gbit}, wan: {bandwidth: 100Mbit, latency: 25ms}}",
        "hfa: {k1: 4, k2: 5}",
        "training: {server_optimizer: outer_nesterov, compression: fp16}",
        "```",
        "",
        "## The topology's structure",
        "",
        "| key | default | meaning |",
        "|---|---|---|",
        *(f"| {_code(key)} | {default} | {text} |" for key, default, text in _HAND_READ_KEYS),
    ]
    for section, spec in SECTIONS:
        title = "Top-level settings" if not section else f"`{section}`"
        lines += ["", f"## {title}", "", _help(spec)]
        for note in (_SECTION_NOTES.get(section, ""), _switch_rule(switch_of(spec))):
            lines += ["", note] if note else []
        lines += ["", *_rows(section, spec)]
    lines += [
        "",
        "## Process variables",
        "",
        "Read by each process at start; `geomx launch` sets them. The counts matter only without a topology file "
        "(GeoMX-style launches).",
        "",
        "| environment | GeoMX alias | meaning |",
        "|---|---|---|",
    ]
    for name in NODE_VARIABLES:
        aliases = ", ".join(_code(alias) for alias in ENV_ALIASES.get(name, ())) or "—"
        lines.append(f"| {_code(name)} | {aliases} | {_cell(_PROCESS_HELP.get(name, ''))} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Print the reference, or with ``--check FILE`` compare it with FILE (exit 1 if they differ)."""
    parser = argparse.ArgumentParser(prog="python -m geomx.config.reference", description=__doc__.split("\n")[0])
    parser.add_argument("--check", metavar="FILE", help="exit 1 if FILE is not what this module generates")
    args = parser.parse_args(argv)
    text = markdown()
    if args.check is None:
        sys.stdout.write(text)
        return 0
    if Path(args.check).read_text() == text:
        return 0
    print(f"{args.check} is stale: regenerate it with `{COMMAND}`", file=sys.stderr)
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
