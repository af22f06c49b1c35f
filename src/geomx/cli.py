"""The ``geomx`` command: ``geomx launch``, ``geomx status``, ``geomx bench``, ``geomx report``.

Usage::

    geomx launch topologies/demo.yaml -- python examples/cnn.py --epochs 8
    geomx status 127.0.0.1:PORT        # the address `geomx launch` printed as "status :"
    geomx bench --quick
    geomx report runs/fsa runs/hfa --out report/
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .bench.sections import SECTION_NAMES, SECTIONS
from .config import ConfigError

SYNC_SCENARIOS = ("same", "slow", "alone", "wide")  # geomx.bench.sync's scenarios (--scenario)


def _launch(args: argparse.Namespace) -> int:
    from .launch import LaunchInterrupted, format_summary, launch

    command = list(args.command)
    if args.global_only and command:  # it would be ignored: the workers are started by each party's own launch
        print(f"geomx launch: --global-only starts the global tier alone, no worker: drop the worker command "
              f"({' '.join(command)}) and start each party with --party on its host (the central one with --join)",
              file=sys.stderr)
        return 2
    if args.join and (not (args.party and args.global_scheduler) or args.global_only):
        print("geomx launch: --join starts one party's processes beside a global tier that runs already: give it "
              "--party and the tier's --global-scheduler HOST:PORT, without --global-only", file=sys.stderr)
        return 2
    try:
        result = launch(Path(args.topology), command, run_dir=Path(args.run_dir) if args.run_dir else None,
                        host=args.host, party=args.party, global_scheduler=args.global_scheduler,
                        resume=args.resume, global_only=args.global_only, join=args.join)
    except (ConfigError, ValueError) as exc:
        print(f"geomx launch: {exc}", file=sys.stderr)
        return 2
    except LaunchInterrupted as stop:  # Ctrl-C or SIGTERM: the job is stopped; its summary says what it did
        result = stop.result
    print(format_summary(result))
    return result.exit_code


def _status(args: argparse.Namespace) -> int:
    import http.client
    import json
    import urllib.error
    import urllib.request

    from .cluster.status_page import render_text

    base = args.address if "://" in args.address else f"http://{args.address}"
    url = base.rstrip("/") + "/status.json"
    try:
        with urllib.request.urlopen(url, timeout=args.timeout) as answer:
            data = json.loads(answer.read())
        print(render_text(data))
    except (OSError, ValueError, KeyError, TypeError, http.client.HTTPException) as exc:
        # unreachable, not an address (HOST:PORT), not a geomx page, or not JSON
        print(f"geomx status: cannot read the status of {url}: {exc}", file=sys.stderr)
        return 2
    return 0


def _keygen(args: argparse.Namespace) -> int:
    from .config import load_topology
    from .transport.security import SecurityError, generate_keys

    try:
        parties = list(args.parties or [])
        if args.topology:
            parties += [p.name for p in load_topology(args.topology).parties if p.name not in parties]
        written = generate_keys(Path(args.folder), parties)
    except (ConfigError, SecurityError) as exc:
        print(f"geomx keygen: {exc}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    print(f"give every host the *.key files and only its own party's *.key_secret; then set "
          f"security.curve_keys: {args.folder} in the topology (or GEOMX_CURVE_KEYS={args.folder})")
    return 0


def _bench(args: argparse.Namespace) -> int:
    from .bench.runner import run_bench

    try:
        return run_bench(quick=args.quick, out_dir=Path(args.out), sections=args.only, sync_scenarios=args.scenario,
                         wan_job=args.job, wan_congestion=args.congestion, scale_path=args.path)
    except ValueError as exc:  # a plan that would measure nothing (runner.check_plan), before anything runs
        print(f"geomx bench: {exc}", file=sys.stderr)
        return 2


def _report(args: argparse.Namespace) -> int:
    from .runs.report import main as report_main

    return report_main(args.runs, args.out, args.label)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="geomx", description="Train one PyTorch model across data centers.")
    sub = parser.add_subparsers(dest="command_name", required=True)
    launch = sub.add_parser("launch", help="start every process of a topology (or one party's)")
    launch.add_argument("topology", help="YAML topology file")
    launch.add_argument("--party", help="start only this party's processes (for a run across hosts)")
    launch.add_argument("--global-scheduler",
                        help="HOST:PORT of the global scheduler: where a --party launch joins it, or where "
                             "--global-only (or the central party's launch) starts it")
    launch.add_argument("--global-only", action="store_true",
                        help="start the global scheduler and servers only (parties join from their own hosts, "
                             "a collective party under its own torchrun)")
    launch.add_argument("--join", action="store_true",
                        help="with --party of the central party: join the global tier a --global-only launch "
                             "started at --global-scheduler instead of starting it")
    launch.add_argument("--host", default="127.0.0.1",
                        help="address this host's processes bind and announce (default: 127.0.0.1)")
    launch.add_argument("--run-dir", help="folder for stats and metrics (default: runs/<time>-<topology>-<pid>)")
    launch.add_argument("--resume", action="store_true",
                        help="the global servers and the workers start from their newest valid checkpoints "
                             "(topology 'checkpoint.dir'; GEOMX_RESUME=1 for a by-hand or torchrun launch)")
    launch.add_argument("command", nargs="*", help="the worker command, after '--'")
    launch.set_defaults(func=_launch)
    status = sub.add_parser("status", help="print a running job's status (its global scheduler's status page)")
    status.add_argument("address", help="HOST:PORT (or the URL) that `geomx launch` printed as 'status :'")
    status.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the page (default 10)")
    status.set_defaults(func=_status)
    keygen = sub.add_parser("keygen", help="make CURVE key pairs (one per party) that encrypt the job's links")
    keygen.add_argument("folder", help="where to write <party>.key (public) and <party>.key_secret")
    keygen.add_argument("--parties", nargs="+", help="party names")
    keygen.add_argument("--topology", help="make keys for every party of this topology file")
    keygen.set_defaults(func=_keygen)
    defaults = [s.name for s in SECTIONS if s.default]
    bench = sub.add_parser("bench", help="measure geomx against a flat PS and gloo, side by side")
    bench.add_argument("--quick", action="store_true",
                       help="fewer steps and repetitions (the default sections: ~12.5 min on 2 quiet cores, "
                            "49 min at load 7-36)")
    bench.add_argument("--out", default="bench-results", help="folder for the JSON results (default: bench-results)")
    bench.add_argument("--only", action="append", choices=SECTION_NAMES, metavar="SECTION",
                       help=f"run only these sections (repeatable; default: {', '.join(defaults)}; on request "
                            f"only: {', '.join(s.name for s in SECTIONS if not s.default)})")
    bench.add_argument("--scenario", action="append", choices=SYNC_SCENARIOS,
                       help="sync section: run only these scenarios' rows (repeatable; 'wide', the bandwidth-bound "
                            "CNN, is in the full run only: refused with --quick)")
    bench.add_argument("--job", choices=["mlp", "lm", "all"],
                       help="wan section: which job (default: mlp with --quick, all otherwise)")
    bench.add_argument("--congestion", help="wan section: the link's TCP congestion control, e.g. cubic (default: the "
                                            "host's)")
    bench.add_argument("--path", choices=["cpu", "staged"], default="cpu",
                       help="scale section: HFA's rounds in place (cpu) or through the staged host mirror, the GPU's "
                            "shape (staged)")
    bench.set_defaults(func=_bench)
    report = sub.add_parser("report", help="plots (loss, accuracy, WAN bytes against wall time) and a table of runs")
    report.add_argument("runs", nargs="+", help="run folders (geomx launch --run-dir)")
    report.add_argument("--out", default="report",
                        help="folder for the PNG plots, report.md and report.json (default: report)")
    report.add_argument("--label", action="append", help="a name per run, in order (default: folder names)")
    report.set_defaults(func=_report)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in argv:  # the worker command follows the first "--"; options may come before it in any order
        split = argv.index("--")
        argv, command = argv[:split], argv[split + 1:]
    args = build_parser().parse_args(argv)
    if command:
        args.command = [*getattr(args, "command", []), *command]
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
