"""One FSA step's timeline across the WAN, from a run traced with ``GEOMX_TRACE=1`` (see ``geomx.transport.trace``).

For party ``--party`` (default dc1, the one whose local server crosses the link to the global server), per step
and then as medians over the steps after ``--skip``: when its workers push, when its local server forwards each
slice, when each slice arrives at the global server, when the global server answers it and when the answer (or, with
early answers, the others' sum) is back at the local server. Times are seconds from the step's first push by
the party's first worker (one clock: every process of the machine shares ``time.time()``, namespaces included).

In a ``lan: collective`` party (``--ranks``) there is no local server: each rank pushes its own slices. Step k is
then every rank's k-th push of each slice it owns, and the phases are per rank: its first and last push queued,
its last answer in, and the global server's first and last arrival from each party (times from the step's first
push by any rank of the job).

The folder is a run folder (``GEOMX_TRACE=1 geomx launch ... --run-dir R``: ``R/trace/``) or a wan bench row's
folder, which holds one run folder per launch (``run-dc0/trace/``, ``run-dc1/trace/``).

Usage::

    GEOMX_TRACE=1 geomx launch topologies/demo.yaml --run-dir runs/traced -- python examples/cnn.py --epochs 1
    .venv/bin/python benchmarks/step_timeline.py runs/traced
    sudo GEOMX_TRACE=1 .venv/bin/python -m geomx.bench.wan --quick --only ddp geomx_fsa --rates 100
    .venv/bin/python benchmarks/step_timeline.py bench-results/wan/mlp/geomx_fsa-100
    .venv/bin/python benchmarks/step_timeline.py bench-results/wan/mlp/geomx_fsa_collective-100 --ranks
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from geomx.transport.trace import read_trace


def steps(events: list[dict[str, Any]], party: str) -> list[tuple[int, float, float]]:
    """(server round, first push, next step's first push) of each complete step of ``party``'s first worker.

    The k-th push of key 0 by the worker starts step k; the local and global servers number that step's rounds
    k as well (round 0 included), so the round number is the step's index."""
    worker = f"{party}/worker0"
    marks = [e["t"] for e in events if e["node"] == worker and e["event"] == "queue" and e["key"] == 0]
    return [(index, marks[index], marks[index + 1]) for index in range(len(marks) - 1)]


def slice_times(events: list[dict[str, Any]], party: str, skip: int) -> dict[tuple[int, int], dict[str, list[float]]]:
    """Per (key, slice): lists (one value per step) of b_out, a_in, a_out, b_in and early_in (the others' sum,
    sent early: geomx.core.early), relative to the step's start."""
    server, starts = f"{party}/server", {r: t for r, t, _ in steps(events, party) if r >= skip}
    found: dict[tuple[int, int], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for e in events:
        start = starts.get(e["round"])
        if start is None:
            continue
        where = None
        if e["node"] == server and "global" in e["peer"]:
            where = {("out", False): "b_out", ("in", True): "b_in", ("in", False): "early_in"}.get(
                (e["event"], e["reply"]))
        elif e["node"].startswith("global_server") and f"{party}/" in e["peer"]:
            where = {("in", False): "a_in", ("out", True): "a_out"}.get((e["event"], e["reply"]))
        if where:
            found[(e["key"], e["slice"])][where].append(e["t"] - start)
            if where == "a_in":
                found[(e["key"], e["slice"])]["bytes"].append(e["nbytes"])
    return found


def phases(events: list[dict[str, Any]], party: str, skip: int) -> dict[str, float]:
    """Medians over the steps: the party's first/last WAN push leaving, arriving, the last answer back, the step."""
    server = f"{party}/server"
    rows: dict[str, list[float]] = defaultdict(list)
    for rnd, start, end in steps(events, party):
        if rnd < skip:
            continue
        mine = [e for e in events if e["round"] == rnd]
        outs = [e["t"] for e in mine if e["node"] == server and e["event"] == "out" and not e["reply"]
                and "global" in e["peer"]]
        arrivals = [e["t"] for e in mine if e["node"].startswith("global_server") and e["event"] == "in"
                    and f"{party}/" in e["peer"]]
        others = [e["t"] for e in mine if e["node"].startswith("global_server") and e["event"] == "in"
                  and f"{party}/" not in e["peer"]]
        back = [e["t"] for e in mine if e["node"] == server and e["event"] == "in" and "global" in e["peer"]]
        if not (outs and arrivals and back):
            continue
        for name, value in (("first WAN push leaves", min(outs)), ("last WAN push leaves", max(outs)),
                            ("first push at the global server", min(arrivals)),
                            ("last push at the global server", max(arrivals)),
                            ("other parties' last push at the global server", max(others, default=start)),
                            ("last answer (or early sum) back at the local server", max(back)),
                            ("next step's first push", end)):
            rows[name].append(value - start)
    return {name: statistics.median(values) for name, values in rows.items()}


def rank_phases(events: list[dict[str, Any]], skip: int) -> tuple[float, dict[str, float]]:
    """Collective parties: (the median step, medians of each rank's and the global server's phases), over steps
    >= ``skip``. A rank's k-th push (or answer) of a slice belongs to step k, which is how it numbers them too."""
    marks: dict[int, dict[str, float]] = defaultdict(dict)
    seen: dict[tuple[str, str, tuple[int, int]], int] = defaultdict(int)

    def mark(what: str, node: str, item: tuple[int, int], t: float, last: str, first: str | None = None) -> None:
        """The k-th such event of ``item`` at ``node`` is step k's: ``last`` names its latest time, ``first`` (if
        given) its earliest."""
        step = seen[(what, node, item)]
        seen[(what, node, item)] += 1
        marks[step][last] = max(marks[step].get(last, t), t)
        if first is not None:
            marks[step][first] = min(marks[step].get(first, t), t)

    for e in events:
        item, node = (e["key"], e["slice"]), e["node"]
        if node.startswith("global_server") and e["event"] == "in" and not e["reply"]:
            party = e["peer"].split("/")[0]
            mark("in", f"{node}<{party}", item, e["t"], f"global server: last push from {party}",
                 f"global server: first push from {party}")
        elif "/worker" in node and e["event"] == "queue" and not e["reply"]:
            mark("push", node, item, e["t"], f"{node}: last push queued", f"{node}: first push queued")
        elif "/worker" in node and e["event"] == "in" and e["reply"]:
            mark("answer", node, item, e["t"], f"{node}: last answer in")
    numbers = sorted(marks)[skip:-1]
    rows: dict[str, list[float]] = defaultdict(list)
    lengths = []
    for step in numbers:
        starts = [t for name, t in marks[step].items() if name.endswith("first push queued")]
        following = [t for name, t in marks.get(step + 1, {}).items() if name.endswith("first push queued")]
        if not starts or not following:
            continue
        lengths.append(min(following) - min(starts))
        for name, t in marks[step].items():
            rows[name].append(t - min(starts))
    if not lengths:
        raise SystemExit("no complete collective step in the trace (was it a lan: collective row?)")
    medians = {name: statistics.median(values) for name, values in rows.items()}
    return statistics.median(lengths), dict(sorted(medians.items(), key=lambda kv: kv[1]))


def run_folders(run: Path) -> list[Path]:
    """The traced run folders in ``run``: itself when it holds ``trace/`` (a ``geomx launch --run-dir``), and its
    ``run-*`` folders (a wan bench row: one per launch)."""
    return [folder for folder in (run, *sorted(run.glob("run-*"))) if (folder / "trace").is_dir()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="a run folder (with trace/) or a wan bench row's folder (with "
                                               "run-dc0/ and run-dc1/)")
    parser.add_argument("--party", default="dc1")
    parser.add_argument("--skip", type=int, default=5, help="leave out the first steps (warm-up)")
    parser.add_argument("--ranks", action="store_true", help="collective parties: each rank's phases")
    args = parser.parse_args()
    events = [e for e in read_trace(run_folders(args.run)) if e["kind"] == "PUSHPULL"]
    if not events:
        raise SystemExit(f"no traced PUSHPULL events under {args.run}/trace or {args.run}/run-*/trace (run with "
                         "GEOMX_TRACE=1)")
    if args.ranks:
        step, medians = rank_phases(events, args.skip)
        print(f"median step {step:.3f} s; medians over steps >= {args.skip} (s from the step's first push):")
        for name, value in medians.items():
            print(f"  {name:52s} {value:7.3f}")
        return 0
    print(f"{args.party}'s step, medians over steps >= {args.skip} (s from the step's first push):")
    for name, value in phases(events, args.party, args.skip).items():
        print(f"  {name:46s} {value:7.3f}")
    print("slice       bytes     leaves B  at A     answer   back at B  early sum at B")
    found = slice_times(events, args.party, args.skip)
    for key, times in sorted(found.items(), key=lambda kv: statistics.median(kv[1].get("a_in") or [9.0])):
        cells = [f"{statistics.median(times[n]):7.3f}" if times.get(n) else "      -"
                 for n in ("b_out", "a_in", "a_out", "b_in", "early_in")]
        print(f"k{key[0]}p{key[1]:<4} {int(statistics.median(times['bytes'] or [0])):9d}  " + "  ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
