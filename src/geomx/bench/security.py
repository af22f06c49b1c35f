"""``geomx bench --only security``: what authentication and CURVE encryption cost in throughput.

The transport section's measurement (``kv.pushpull`` of large float32 tensors between one worker and the
global server, flat topology, loopback, no emulation) three times: without security, with a shared secret
(ZeroMQ PLAIN: checked once per connection, so it should cost nothing per byte) and with CURVE (every
byte encrypted and authenticated: Curve25519 + XSalsa20-Poly1305 in libzmq/libsodium). Ratios are to the
run without security. Nothing asserts.

Usage::

    geomx bench --only security --quick
"""

from __future__ import annotations

import argparse
import io
import shutil
import sys
from pathlib import Path
from typing import Any

import yaml

from ..launch import launch
from ..runs.runlog import read_metrics
from ..transport.security import generate_keys
from .alone import run_alone
from .sections import BenchPlan, Interrupted
from .tables import say

MODES = ("none", "secret", "curve")


def _topology(out_dir: Path, mode: str) -> Path:
    raw: dict[str, Any] = {"parties": {"dc0": {"workers": 1}}, "central": "dc0", "global_servers": 1,
                           "mode": "flat"}
    if mode == "secret":
        raw["security"] = {"secret": "bench-shared-secret-0123456789"}
    elif mode == "curve":
        keys = out_dir / "security-keys"
        shutil.rmtree(keys, ignore_errors=True)
        generate_keys(keys, ["dc0"])
        raw["security"] = {"curve_keys": str(keys)}
    path = out_dir / "topologies" / f"security-{mode}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _pushpull(out_dir: Path, mode: str, sizes_mb: list[float], reps: int) -> list[dict[str, Any]]:
    run_dir = out_dir / "runs" / f"security-{mode}"
    shutil.rmtree(run_dir, ignore_errors=True)
    command = [sys.executable, "-m", "geomx.bench.workers.transport", "--sizes-mb", *[f"{s:g}" for s in sizes_mb],
               "--reps", str(reps), "--warmup", "2"]
    log = io.StringIO()
    result = launch(_topology(out_dir, mode), command, run_dir=run_dir, out=log)
    (out_dir / "logs").mkdir(parents=True, exist_ok=True)
    (out_dir / "logs" / f"security-{mode}.log").write_text(log.getvalue())
    if result.exit_code != 0:
        raise RuntimeError(f"security-{mode} failed ({result.failed}); see {out_dir / 'logs'}/security-{mode}.log")
    records = [r for records in read_metrics(run_dir).values() for r in records if "gbps" in r]
    if len(records) != len(sizes_mb):
        raise RuntimeError(f"security-{mode}: expected {len(sizes_mb)} records, got {len(records)}")
    return records


def run(plan: BenchPlan, out_dir: Path) -> dict[str, Any]:
    """The section's entry point (see ``run_security``)."""
    return run_security(plan.quick, out_dir)


def run_security(quick: bool, out_dir: Path) -> dict[str, Any]:
    """Measure every mode; returns the section for bench.json (rows of GB/s and ratios to no security).

    The modes alternate (none, secret, curve, none, ...) and each keeps its best run, so a burst of load
    from another process does not land on one mode only.
    """
    sizes = [4.0, 32.0] if quick else [4.0, 100.0]
    reps = 5 if quick else 10
    rounds = 2 if quick else 3
    section: dict[str, Any] = {"setup": {"sizes_mb": sizes, "reps": reps, "rounds": rounds, "modes": list(MODES),
                                         "how": "kv.pushpull worker <-> global server, flat, loopback; "
                                                "best of the alternated rounds per mode and size"},
                               "errors": [], "raw": {mode: [] for mode in MODES}}
    try:
        for round_index in range(rounds):
            for mode in MODES:
                say(f"[security] round {round_index + 1}/{rounds}: pushpull with security={mode} ...")
                try:
                    section["raw"][mode].append(_pushpull(out_dir, mode, sizes, reps))
                except Exception as exc:  # record and go on
                    section["errors"].append(f"{mode}: {exc}")
    except KeyboardInterrupt:  # SIGINT/SIGTERM (the job in flight has stopped): the runs so far, marked interrupted
        section["interrupted"] = True
        raise Interrupted(_rows(section, sizes)) from None
    return _rows(section, sizes)


def _rows(section: dict[str, Any], sizes: list[float]) -> dict[str, Any]:
    """The section with its rows: per size, each mode's best run and the ratios to no security."""
    rows = []
    for index, size in enumerate(sizes):
        row: dict[str, Any] = {"size_mb": size}
        for mode, runs in section["raw"].items():
            if runs:
                row[f"{mode}_gbps"] = max(run[index]["gbps"] for run in runs)
                row[f"{mode}_median_ms"] = min(run[index]["median_s"] for run in runs) * 1000
        for mode in ("secret", "curve"):
            if row.get("none_gbps") and row.get(f"{mode}_gbps"):
                row[f"{mode}_over_none"] = row[f"{mode}_gbps"] / row["none_gbps"]
        rows.append(row)
    section["rows"] = rows
    return section


def lines(section: dict[str, Any]) -> list[str]:
    """The section's table for the bench report."""
    def fmt(value: Any, spec: str, suffix: str = "") -> str:
        """Right-aligned to the spec's width, suffix included; "-" (not "-x") where nothing was measured."""
        width = int(spec.split(".")[0]) + len(suffix)
        return ("-" if value is None else format(value, spec) + suffix).rjust(width)

    out = [f"[security] kv.pushpull, worker <-> global server on loopback; {section['setup']['reps']} timed ops",
           f"{'tensor':>8} | {'none GB/s':>9} | {'secret GB/s':>11} | {'secret/none':>11} | "
           f"{'CURVE GB/s':>10} | {'CURVE/none':>10}"]
    for row in section.get("rows", []):
        out.append(f"{row['size_mb']:>6g}MB | {fmt(row.get('none_gbps'), '9.3f')} | "
                   f"{fmt(row.get('secret_gbps'), '11.3f')} | {fmt(row.get('secret_over_none'), '10.2f', 'x')} | "
                   f"{fmt(row.get('curve_gbps'), '10.3f')} | {fmt(row.get('curve_over_none'), '9.2f', 'x')}")
    out.append("note: the shared secret is checked once per connection (ZeroMQ PLAIN + ZAP); CURVE encrypts "
               "every byte of every link.")
    out += [f"error: {error}" for error in section.get("errors", [])]
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m geomx.bench.security [--out OUT]``: this section alone (``geomx bench --only security``), at
    --quick's sizes; OUT/security.json and the table (a stop: ``geomx bench``'s, ``geomx.bench.alone``)."""
    parser = argparse.ArgumentParser(prog="python -m geomx.bench.security", description=main.__doc__)
    parser.add_argument("--out", default="bench-results", help="folder for the JSON results (default: bench-results)")
    out_dir = Path(parser.parse_args(argv).out).resolve()
    return run_alone("security", lambda: run_security(quick=True, out_dir=out_dir), out_dir, lines)


if __name__ == "__main__":
    sys.exit(main())
