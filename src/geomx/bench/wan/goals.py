"""The wan section's goals (``geomx bench --only wan``): each said with the figure measured in the same run (met /
NOT met / not measured), never asserted. ``section`` prints them under each job's table.

Usage::

    for line in goal_lines(result["jobs"]["mlp"]):   # goal (mlp): 100 Mbit/s, geomx best ... : 9.10x -> met
        print(line)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .systems import H

# the torchft peer as torchtitan runs it (one replica group per data center) and geomx's collective rows against it
GROUPS_PEER = "diloco_groups"
COLLECTIVE = "geomx_hfa_outer_collective"


def fmt(value: Any, spec: str, suffix: str = "") -> str:
    """``value`` formatted by ``spec`` with ``suffix``; ``-`` for None (not measured)."""
    return "-" if value is None else f"{value:{spec}}{suffix}"


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """``numerator / denominator``; None where either is missing or zero."""
    return numerator / denominator if numerator and denominator else None


def goal_lines(block: dict[str, Any]) -> list[str]:
    """The issue's goals for one job, each with the ratio measured in this run (met / NOT met / not measured)."""
    rates = block.get("rates", {})
    job_name = block.get("job", "mlp")
    higher = block.get("higher_is_better", True)
    lines = []

    def row(rate: str, name: str) -> dict[str, Any]:
        return rates.get(rate, {}).get("rows", {}).get(name, {})

    def say(text: str, value: float | None, ok: bool | None) -> None:
        verdict = "not measured" if value is None else "met" if ok else "NOT met"
        lines.append(f"goal ({job_name}): {text}: {fmt(value, '.2f', 'x')} -> {verdict}")

    def soonest(runs: dict[str, dict[str, Any]]) -> tuple[str, dict[str, Any]]:
        """The row of ``runs`` that reached the target first (name, figures); ("", {}) if there is none."""
        return min(runs.items(), key=lambda nf: nf[1].get("time_to_target_s") or float("inf"), default=("", {}))

    def best(rate: str) -> tuple[str, dict[str, Any]]:
        """geomx's best configuration on this job: the geomx row that reached the target soonest (the row
        named geomx_best is the one designed for the MLP; on another job another row may do better)."""
        runs = rates.get(rate, {}).get("rows", {})
        reached = {n: f for n, f in runs.items() if n.startswith("geomx") and f.get("time_to_target_s") is not None}
        return soonest(reached) if reached else ("geomx_best", row(rate, "geomx_best"))

    for rate, goal in (("100", 8.0), ("20", 30.0)):
        name, found = best(rate)
        value = found.get("vs_ddp_link")
        say(f"{rate} Mbit/s, geomx best ({name}) reaches the target >= {goal:g}x sooner than DDP on the link", value,
            value is not None and value >= goal)
    name, found = best("100")
    loop = found.get("vs_loopback")
    say(f"100 Mbit/s, geomx best ({name}) within 1.4x of DDP on loopback", loop, loop is not None and loop <= 1.4)

    def sooner(rate: str, mine: dict[str, Any], what: str, peer: str) -> None:
        other = row(rate, peer)
        value = ratio(other.get("time_to_target_s"), mine.get("time_to_target_s"))
        no_worse = (mine.get("final_accuracy") is not None and other.get("final_accuracy") is not None
                    and (mine["final_accuracy"] - other["final_accuracy"]) * (1 if higher else -1) >= 0)
        say(f"{rate} Mbit/s, geomx {what} >= 1.3x sooner than {peer} at the same H, final value no worse "
            f"({fmt(mine.get('final_accuracy'), '.3f')} vs {fmt(other.get('final_accuracy'), '.3f')})",
            value, value is not None and value >= 1.3 and no_worse)

    for rate in rates:
        # HFA + outer as it runs dense (HiPS's one copy per party alone) and with a WAN codec (the best row)
        runs = rates[rate].get("rows", {})
        outer = {n: f for n, f in runs.items() if f.get("settings", {}).get("outer")} or \
            {n: runs[n] for n in ("geomx_hfa_outer", "geomx_hfa_outer_h", "geomx_hfa_outer_h_p3") if n in runs}
        _, dense = soonest({n: f for n, f in outer.items() if not f.get("settings", {}).get("compression")})
        _, coded = soonest({n: f for n, f in outer.items() if f.get("settings", {}).get("compression")})
        for peer in ("diloco", "local_sgd"):
            sooner(rate, dense, "HFA + outer, dense (the soonest such row)", peer)
            if coded:
                sooner(rate, coded, "HFA + outer with its WAN codec (the soonest such row)", peer)
        # the same arithmetic on both sides: HFA's plain model average against PostLocalSGD's
        sooner(rate, row(rate, "geomx_hfa_h"), f"HFA 1x{H} (model average, PostLocalSGD's schedule)", "local_sgd")
        fsa = row(rate, "geomx_fsa").get("step_speedup_vs_ddp")
        say(f"{rate} Mbit/s, geomx FSA >= 1.3x faster per step than DDP", fsa, fsa is not None and fsa >= 1.3)
        if "geomx_fsa_collective" in runs:  # the same goal for collective parties (each rank its own WAN stream)
            fsa = runs["geomx_fsa_collective"].get("step_speedup_vs_ddp")
            say(f"{rate} Mbit/s, geomx FSA in collective parties >= 1.3x faster per step than DDP over all the ranks",
                fsa, fsa is not None and fsa >= 1.3)
    for rate, rate_block in rates.items():
        lines += group_peer_lines(rate, rate_block.get("rows", {}), job_name, higher)
    return lines


def codec_rows(runs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The collective HFA + outer rows with a WAN codec (``geomx_hfa_outer_collective_<codec>``), in run order."""
    return {n: f for n, f in runs.items() if n.startswith(COLLECTIVE + "_") and f.get("settings", {}).get(
        "compression")}


def best_codec_row(coded: dict[str, dict[str, Any]], time_to: Callable[[dict[str, Any]], float | None]
                   ) -> tuple[str, dict[str, Any]]:
    """The row of ``coded`` (``codec_rows``) that reached the goal's value soonest (``time_to``: a row's time to
    it), else the first one run; ("", {}) if none ran."""
    reached = {n: f for n, f in coded.items() if time_to(f) is not None}
    pool = reached or coded
    return min(pool.items(), key=lambda nf: time_to(nf[1]) or float("inf"), default=("", {}))


def group_peer_lines(rate: str, runs: dict[str, dict[str, Any]], job_name: str, higher: bool) -> list[str]:
    """geomx's collective parties against torchft DiLoCo in one replica group per data center (2 x 2 ranks) at
    the same H, from this run's figures: WAN bytes per party (each direction is what one party sends), time to
    the target, and the best codec's time and final value. Nothing is said where the peer did not run."""
    peer = runs.get(GROUPS_PEER)
    if peer is None:
        return []
    dense = runs.get(COLLECTIVE, {})
    lines: list[str] = []

    def say(text: str, value: float | None, ok: bool) -> None:
        verdict = "not measured" if value is None else "met" if ok else "NOT met"
        lines.append(f"goal ({job_name}): {rate} Mbit/s, {text}: {fmt(value, '.2f', 'x')} -> {verdict}")

    def mb(figures: dict[str, Any], way: str) -> str:
        return fmt(figures.get(f"mb_{way}"), ".1f")

    # while training (every rank joined, each clock started): set-up differs by design (geomx's INIT sends the
    # master's model to the other party once; the peer starts from equal seeds and skips its start-up sync)
    ways = [ratio(peer.get(f"mb_train_{w}"), dense.get(f"mb_train_{w}")) for w in ("a_to_b", "b_to_a")]
    fewest = None if None in ways else min(w for w in ways if w is not None)
    say(f"geomx HFA {H}x1 + outer (collective) sends no more WAN bytes per party while training than {GROUPS_PEER} "
        f"(A sends {mb(dense, 'train_a_to_b')} vs {mb(peer, 'train_a_to_b')} MB, B sends {mb(dense, 'train_b_to_a')} "
        f"vs {mb(peer, 'train_b_to_a')}; whole runs, set-up included: A {mb(dense, 'a_to_b')} vs {mb(peer, 'a_to_b')}, "
        f"B {mb(dense, 'b_to_a')} vs {mb(peer, 'b_to_a')}; the peer's / geomx's, the lower of the two)", fewest,
        fewest is not None and fewest >= 1.0)
    goal, time_to = goal_value(peer, higher)
    mine_s, theirs_s = time_to(dense), time_to(peer)
    sooner = ratio(theirs_s, mine_s)
    say(f"geomx HFA {H}x1 + outer (collective) reaches {goal} no later than {GROUPS_PEER} "
        f"({fmt(mine_s, '.1f', ' s')} vs {fmt(theirs_s, '.1f', ' s')}; >= 1.0x)", sooner,
        sooner is not None and sooner >= 1.0)
    codecs = codec_rows(runs)
    name, coded = best_codec_row(codecs, time_to)
    mine, theirs = coded.get("final_accuracy"), peer.get("final_accuracy")
    no_worse = mine is not None and theirs is not None and (mine - theirs) * (1 if higher else -1) >= 0
    codec = (coded.get("settings", {}).get("compression") or {}).get("type", "-")
    coded_s = time_to(coded)
    faster = ratio(theirs_s, coded_s)
    say(f"geomx's best collective codec ({name or 'not run'}, {codec}) reaches {goal} >= 3x sooner than "
        f"{GROUPS_PEER}, final value no worse ({fmt(mine, '.3f')} vs {fmt(theirs, '.3f')}; "
        f"{fmt(coded_s, '.1f', ' s')} vs {fmt(theirs_s, '.1f', ' s')})",
        faster, faster is not None and faster >= 3.0 and no_worse)
    lines += same_value_lines(rate, peer, {COLLECTIVE: dense, **codecs}, job_name, higher)
    return lines


def goal_value(peer: dict[str, Any], higher: bool) -> tuple[str, Callable[[dict[str, Any]], float | None]]:
    """What the time goals against ``peer`` count to, and each row's time to it: the job's target, or, where the
    peer never reached the target but was evaluated, the peer's own final value (a peer a hair short of the target
    would otherwise leave every time goal unmeasured; the line says which)."""
    evaluations = peer.get("evaluations") or []
    if peer.get("time_to_target_s") is not None or not evaluations:
        return "the target", lambda figures: figures.get("time_to_target_s")
    final = evaluations[-1][2]
    return (f"the peer's final value {final:.4f} (the peer never reached the target)",
            lambda figures: first_time_at(figures, final, higher))


def first_time_at(figures: dict[str, Any], value: float, higher: bool) -> float | None:
    """Training seconds of ``figures``' first evaluation at ``value`` or better (None: never)."""
    for _, seconds, got in figures.get("evaluations", []):
        if (got >= value) if higher else (got <= value):
            return float(seconds)
    return None


def same_value_lines(rate: str, peer: dict[str, Any], rows: dict[str, dict[str, Any]], job_name: str,
                     higher: bool) -> list[str]:
    """Not a goal: the time each of ``rows`` takes to the peer's own final value against the peer's, where the
    peer does not reach the job's target (a row that ends a hair short of it says no time to target at all)."""
    evaluations = peer.get("evaluations") or []
    if not evaluations or peer.get("time_to_target_s") is not None:
        return []
    final = evaluations[-1][2]  # as every row's evaluations are kept: rounded to 4 digits
    theirs = first_time_at(peer, final, higher)
    said = [f"{name} {fmt(first_time_at(f, final, higher), '.1f', ' s')} "
            f"({fmt(ratio(theirs, first_time_at(f, final, higher)), '.2f', 'x')})"
            for name, f in rows.items() if name and f]
    return [f"info ({job_name}): {rate} Mbit/s, {GROUPS_PEER} did not reach the target; to its final value "
            f"{final:.4f} it took {fmt(theirs, '.1f', ' s')}: " + ", ".join(said)]
