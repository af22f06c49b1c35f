"""``geomx bench --only sched``: communication scheduling — MultiGPS, DGT, TSEngine; measured, never asserted.

* **MultiGPS**: pushpull of a large tensor (split evenly over the global servers) from 2 parties with 1, 2
  and 4 global servers (HiPS, no link emulation: the servers' CPU and sockets are the limit). Per global
  server: bytes received and sent and CPU seconds (from the run's stats files); the master's time per
  pushpull.
* **TSEngine**: the star against TSEngine's overlays in two in-casts: pushpull to 4 parties over uneven WAN
  links with the global server's party behind one access link (``ENABLE_INTER_TS``), and 4 workers of one
  party pushing to and pulling from their local server over a LAN with a NIC-like ingress
  (``ENABLE_INTRA_TS``).
* **DGT**: examples/cnn.py on digits over the emulated WAN (2 parties x 2 workers), reliable-only against
  DGT at 0%, 1% and 5% loss per UDP channel, DGT with random block order at 5% (the baseline that shows
  contribution order matters) and adaptive K at 5%: step time, final accuracy, blocks lost.

Usage::

    geomx bench --only sched --quick
    python -m geomx.bench.sched --quick --only dgt --out bench-results/sched   # one part alone
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

from ..algorithms.dgt import datagrams as dgt
from ..algorithms.tsengine import rules as tsengine
from ..launch import LaunchResult
from ..runs.runlog import read_stats
from .alone import run_alone
from .jobs import WAN, find_examples, master_records, run_job, write_topology
from .sections import BenchPlan
from .tables import say, table

GLOBAL_SERVERS = (1, 2, 4)


def _pushpull_command(size_mb: float, reps: int) -> list[str]:
    """The transport bench worker timing ``reps`` pushpulls of ``size_mb`` after one warm-up."""
    return [sys.executable, "-m", "geomx.bench.workers.transport", "--sizes-mb", f"{size_mb:g}", "--reps",
            str(reps), "--warmup", "1"]


def _master_records_of(name: str, raw: dict[str, Any], command: list[str], out_dir: Path,
                       errors: list[str]) -> tuple[LaunchResult, list[dict[str, Any]]] | None:
    """Run ``command`` as job ``name`` on topology ``raw``; its result and the master's records, or None (the
    failure is appended to ``errors``, naming the job's log)."""
    topology = write_topology(out_dir / "topologies" / f"{name}.yaml", raw)
    result, metrics = run_job(name, topology, command, out_dir)
    records = master_records(metrics)
    if result.exit_code != 0 or not records:
        errors.append(f"{name} failed ({result.failed}); see {out_dir / 'logs' / name}.log")
        return None
    return result, records


def _multigps(quick: bool, out_dir: Path, errors: list[str]) -> dict[str, Any]:
    size_mb, reps = (16.0, 5) if quick else (64.0, 10)
    rows: dict[str, Any] = {}
    for servers in GLOBAL_SERVERS:
        name = f"sched-multigps-{servers}gs"
        raw = {"parties": {"dc0": {"workers": 1}, "dc1": {"workers": 1}}, "central": "dc0",
               "global_servers": servers, "mode": "hips"}
        command = _pushpull_command(size_mb, reps)
        say(f"[sched] {name}: pushpull of {size_mb:g} MB x{reps}, 2 parties, {servers} global server(s) ...")
        outcome = _master_records_of(name, raw, command, out_dir, errors)
        if outcome is None:
            continue
        result, records = outcome
        per_server = {s["name"]: {"recv_mb": (s["lan"]["recv"] + s["wan"]["recv"]) / 1e6,
                                  "sent_mb": (s["lan"]["sent"] + s["wan"]["sent"]) / 1e6,
                                  "cpu_s": s.get("cpu_s")}
                      for s in read_stats(out_dir / "runs" / name) if s.get("role") == "global_server"}
        rows[str(servers)] = {"global_servers": servers, "size_mb": size_mb, "reps": reps,
                              "step_ms": records[0]["mean_s"] * 1000, "median_ms": records[0]["median_s"] * 1000,
                              "per_server": per_server, "wall_s": result.wall_s}
        say(f"[sched] {name}: {rows[str(servers)]['step_ms']:.0f} ms per pushpull; "
             + ", ".join(f"{n} {v['recv_mb']:.0f} MB in / {v['cpu_s'] or 0:.1f} s CPU" for n, v in per_server.items()))
    return rows


DGT_ROWS: tuple[tuple[str, dict[str, Any] | None], ...] = (
    ("reliable_only", None),
    ("dgt_loss0", {"loss": 0.0}),
    ("dgt_loss1", {"loss": 0.01}),
    ("dgt_loss5", {"loss": 0.05}),
    ("dgt_loss5_random_order", {"loss": 0.05, "random_order": True}),
    ("dgt_loss5_adaptive", {"loss": 0.05, "adaptive": True, "k_min": 0.2}),
)
DGT_BASE = {"channels": 3, "k": 0.5, "block_bytes": 512, "deadline": "50ms", "seed": 1}


def _dgt(quick: bool, out_dir: Path, errors: list[str]) -> dict[str, Any]:
    try:
        cnn = find_examples() / "cnn.py"
    except RuntimeError as exc:
        errors.append(str(exc))
        return {}
    epochs = 6 if quick else 12
    rows: dict[str, Any] = {}
    for label, extra in DGT_ROWS:
        name = f"sched-{label}"
        raw: dict[str, Any] = {"parties": {"dc0": {"workers": 2}, "dc1": {"workers": 2}}, "central": "dc0",
                               "mode": "hips", "links": {"wan": WAN}}
        if extra is not None:
            raw["dgt"] = {**DGT_BASE, **extra}
        command = [sys.executable, str(cnn), "--epochs", str(epochs)]
        say(f"[sched] {name}: examples/cnn.py, {epochs} epochs over the emulated WAN ...")
        outcome = _master_records_of(name, raw, command, out_dir, errors)
        if outcome is None:
            continue
        result, records = outcome
        reports = dgt.read_reports(out_dir / "runs" / name)
        senders = [r for r in reports.values() if r.get("role") == "sender"]
        receiver = next((r for r in reports.values() if r.get("role") == "receiver"), {})
        ks = [k for r in senders for k in r.get("k_history", [])]
        rows[label] = {
            "dgt": raw.get("dgt"), "epochs": epochs, "steps": records[-1]["steps"],
            "test_accuracy": records[-1]["test_accuracy"],
            "step_ms": statistics.median(r["step_ms"] for r in records[1:]) if len(records) > 1
            else records[-1]["step_ms"],
            "wan_mb": result.summary.get("wan_bytes", 0) / 1e6,  # ZeroMQ and UDP bytes, as the summary counts them
            "udp_blocks": sum(r.get("udp_blocks", 0) for r in senders),
            "udp_mb": sum(r.get("udp_bytes", 0) for r in senders) / 1e6,
            "reliable_blocks": sum(r.get("reliable_blocks", 0) for r in senders),
            "blocks_lost": receiver.get("lost"), "late_folded": receiver.get("late_folded"),
            "k_mean": statistics.fmean(ks) if ks else None,
            "reported_loss": [r.get("reported_loss") for r in senders],
        }
        row = rows[label]
        say(f"[sched] {name}: acc {row['test_accuracy']:.4f}, step {row['step_ms']:.0f} ms, "
             f"UDP blocks {row['udp_blocks']}, lost {row['blocks_lost']}")
    return rows


TS_SCENARIOS: dict[str, dict[str, Any]] = {
    # In-cast across parties: 4 parties push to and pull from the global server, whose party reaches the WAN
    # through one 50 Mbit/s access link (every push queues there, every answer leaves through it); the other
    # parties are joined by 200 Mbit/s pipes, one of them (dc3) by 20 Mbit/s.
    "inter": {"parties": {"dc0": {"workers": 1, "access": "50Mbit"}, "dc1": {"workers": 1},
                          "dc2": {"workers": 1},
                          "dc3": {"workers": 1, "wan": {"bandwidth": "20Mbit", "latency": "40ms"}}},
              "central": "dc0", "mode": "hips", "links": {"wan": {"bandwidth": "200Mbit", "latency": "10ms"}}},
    # In-cast inside a party: 4 workers push to and pull from their local server over a 100 Mbit/s LAN whose
    # nodes receive at that rate too (links.lan.ingress); one party, so only the LAN counts.
    "intra": {"parties": {"dc0": {"workers": 4}}, "central": "dc0", "mode": "hips",
              "links": {"lan": {"bandwidth": "100Mbit", "latency": "0ms", "ingress": True}}},
}


def _tsengine(quick: bool, out_dir: Path, errors: list[str], scenario: str) -> dict[str, Any]:
    """The star against TSEngine's overlays in one of TS_SCENARIOS (``inter``: ENABLE_INTER_TS between the
    global server and 4 parties; ``intra``: ENABLE_INTRA_TS between a local server and its 4 workers)."""
    size_mb, reps = {("inter", True): (4.0, 5), ("inter", False): (16.0, 10),
                     ("intra", True): (4.0, 4), ("intra", False): (8.0, 8)}[(scenario, quick)]
    rows: dict[str, Any] = {}
    for label, ts in (("star", None), ("tsengine", {"max_greed": 0.9, "seed": 0, "inter": scenario == "inter",
                                                    "intra": scenario == "intra"})):
        name = f"sched-{scenario}-incast-{label}"
        raw: dict[str, Any] = {**TS_SCENARIOS[scenario]}
        if ts is not None:
            raw["tsengine"] = ts
        command = _pushpull_command(size_mb, reps)
        say(f"[sched] {name}: pushpull of {size_mb:g} MB x{reps}, {scenario} in-cast ...")
        outcome = _master_records_of(name, raw, command, out_dir, errors)
        if outcome is None:
            continue
        result, records = outcome
        reports = tsengine.read_reports(out_dir / "runs" / name)
        report = next((r for n, r in reports.items() if n.startswith("global") == (scenario == "inter")), {})
        rows[label] = {"step_ms": records[0]["mean_s"] * 1000, "size_mb": size_mb,
                       "disseminate_ms": (report["mean_disseminate_s"] * 1000
                                          if report.get("mean_disseminate_s") is not None else None),
                       "explore": report.get("explore"), "exploit": report.get("exploit"),
                       "merges": report.get("merges"),
                       "wan_mb": result.summary.get("wan_bytes", 0) / 1e6}
        say(f"[sched] {name}: {rows[label]['step_ms']:.0f} ms per pushpull")
    return rows


def run(plan: BenchPlan, out_dir: Path) -> dict[str, Any]:
    """The section's entry point: MultiGPS, DGT and TSEngine; the figures for bench.json (``lines`` prints them)."""
    quick = plan.quick
    errors: list[str] = []
    return {"multigps": _multigps(quick, out_dir, errors), "dgt": _dgt(quick, out_dir, errors),
            "tsengine": _tsengine(quick, out_dir, errors, "inter"),
            "tsengine_intra": _tsengine(quick, out_dir, errors, "intra"), "errors": errors}


def lines(report: dict[str, Any]) -> list[str]:
    """The section's tables: those of the parts in ``report`` (``main`` runs one part alone)."""
    out: list[str] = []
    if "multigps" in report:
        out += _multigps_lines(report["multigps"])
    if "dgt" in report:
        out += ([""] if out else []) + _dgt_lines(report["dgt"])
    for part in ("tsengine", "tsengine_intra"):
        if part in report:
            out += ([""] if out else []) + _tsengine_lines(part, report[part])
    if report.get("errors"):
        out += [f"[sched] error: {e}" for e in report["errors"]]
    return out


def _multigps_lines(multigps: dict[str, Any]) -> list[str]:
    """MultiGPS's table: per number of global servers, the step and each server's bytes and CPU."""
    out = ["[sched] MultiGPS: pushpull of one large tensor, 2 parties, HiPS, no emulation"]
    rows = []
    for row in multigps.values():
        servers = row["per_server"].values()
        rows.append([str(row["global_servers"]), f"{row['step_ms']:.0f}",
                     " / ".join(f"{s['recv_mb']:.0f}" for s in servers),
                     " / ".join(f"{s['cpu_s'] or 0:.1f}" for s in servers)])
    return out + table(["global servers", "ms per pushpull", "MB received per server", "CPU s per server"], rows)


def _dgt_lines(dgt: dict[str, Any]) -> list[str]:
    """DGT's table: each run's accuracy, step, bytes and datagrams."""
    out = ["[sched] DGT: examples/cnn.py over the emulated WAN (2 parties x 2 workers)"]
    rows = []
    for label, row in dgt.items():
        rows.append([label, f"{row['test_accuracy']:.4f}", f"{row['step_ms']:.0f}", f"{row['wan_mb']:.1f}",
                     f"{row['udp_mb']:.1f}",
                     str(row["udp_blocks"]), str(row["blocks_lost"] if row["blocks_lost"] is not None else "-"),
                     f"{row['k_mean']:.2f}" if row["k_mean"] is not None else "-"])
    out += table(["run", "accuracy", "step ms", "WAN MB (ZeroMQ + UDP)", "UDP MB", "UDP blocks", "lost",
                   "mean K"], rows)
    out.append("      UDP MB: both local servers' datagrams (dc0's travel on its LAN, dc1's share its WAN pipe "
               "behind the ZeroMQ messages); lost: missing at the deadline (late ones are folded into the next "
               "round); mean K: adaptive K follows the global server's loss reports")
    return out


TS_TITLES = {"tsengine": "pushpull to 4 parties, in-cast at dc0's 50 Mbit/s access link (dc3 20 Mbit/s, other "
                         "pairs 200 Mbit/s); ENABLE_INTER_TS",
             "tsengine_intra": "pushpull of 4 workers through their local server, in-cast at its 100 Mbit/s LAN "
                               "side; ENABLE_INTRA_TS"}


def _tsengine_lines(part: str, found: dict[str, Any]) -> list[str]:
    """One TSEngine scenario's table: the star against TSEngine's overlay."""
    out = [f"[sched] TSEngine: {TS_TITLES[part]}"]
    rows = [[label, f"{row['step_ms']:.0f}",
             f"{row['disseminate_ms']:.0f}" if row["disseminate_ms"] is not None else "-",
             str(row["merges"]) if row["merges"] is not None else "-", f"{row['wan_mb']:.1f}"]
            for label, row in found.items()]
    out += table(["overlay", "ms per pushpull", "ms to disseminate (coordinator)", "pre-merges", "WAN MB"], rows)
    star, ts = (found.get(k) for k in ("star", "tsengine"))
    if star and ts:
        out.append(f"      TSEngine {star['step_ms'] / ts['step_ms']:.2f}x the star's speed")
    return out


PARTS = {"multigps": _multigps, "dgt": _dgt}


def main(argv: list[str] | None = None) -> int:
    """Run one part of the section alone (``geomx bench --only sched`` runs them all); prints its table and writes
    ``OUT/sched-<part>.json``."""
    parser = argparse.ArgumentParser(prog="python -m geomx.bench.sched", description=main.__doc__)
    parser.add_argument("--only", choices=sorted(PARTS), required=True)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default="bench-results/sched")
    args = parser.parse_args(argv)
    out_dir = Path(args.out)

    def measure() -> dict[str, Any]:
        errors: list[str] = []
        return {args.only: PARTS[args.only](args.quick, out_dir, errors), "errors": errors}

    return run_alone("sched", measure, out_dir, lines, json_name=f"sched-{args.only}")


if __name__ == "__main__":
    sys.exit(main())
