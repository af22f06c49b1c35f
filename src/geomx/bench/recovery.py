"""``geomx bench --only recovery``: how long a lost data center takes to train with the others again, in parts,
for the 85M stand-in on loopback (issue 49's recovery goals: a restarted party contributes within 30 s; its
340 MB state moves in at most 2 s).

Two parties of two ranks, ``lan: collective`` (the scale section's job: ``geomx.bench.workers.scale_step``, the
accelerator stand-in's 40 ms steps, DiLoCo's blocking rounds every H = 100 steps, outer Nesterov), each launched on
its own (``geomx launch --party``, as on its own host), no emulated link. dc1 (dc0 holds the global tier) gets
SIGKILL, every process at once, in the middle of its second outer round; the bench watches the global
scheduler's ``/status.json`` until dc1's ranks are declared dead, then starts dc1 again, which trains two outer
rounds and leaves; dc0 trains on until two outer rounds after the restarted dc1's first is in (a file dc1 writes,
so that a slow restart on a loaded machine is measured, not cut short). The parts, each from the one before it
ends:

- ``detection_s``: the kill to the scheduler's declaring dc1 dead (the heartbeat timeout, ``heartbeat_s``);
- ``reform_s``: dc1 started again to its ranks' kvstores joined: the interpreter and its imports (``imports_s``),
  the 85M model built (``model_s``), the stand-in's one real gradient and optimizer state (``setup_s``: a real
  job's restart builds its optimizer state too), the party's gloo group formed and the scheduler's admission in
  place of the dead ranks (``join_s``);
- ``wrapper_s``: the wrapper's start (``DistributedOptimizer``), of which ``state_s`` is its INIT: the job's model
  (``model_mb``) from the global server into the party's ranks (``state_mb_per_s``; the kvstore's ``init_s``, the
  longer rank's, so on a tiny model it may exceed ``wrapper_s``, which ends at the later rank's ends), and the rest
  chiefly DiLoCo's own copy of the job's model (a local copy: 342 MB of fresh pages);
- ``first_contribution_s``: from then to the end of the restarted party's first outer round (H stand-in steps and
  the round trip: its first contribution is in and answered).

``rejoin_s`` (restart to first contribution, goal 30 s) is re-forming, the wrapper's start and the first
contribution together; ``others_stalled_s`` is the
longest time dc0's ranks went without a step beyond their median step (dc0's global round waits for dc1 until
dc1 is declared dead, and again for the restarted dc1's first contribution).

Usage::

    geomx bench --only recovery            # or --quick (the same job: it is short)
    python -m geomx.bench.recovery         # bench-results/recovery.json and the table
"""

from __future__ import annotations

import json
import sys
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..launch import LaunchResult
from .alone import add_out, run_alone
from .chaos.plan import fresh, launch_party, longest_stall_s, read_fault, read_ranks, without_step_ends
from .jobs import free_port, load_avg, write_topology
from .sections import BenchPlan, Interrupted
from .tables import fmt, say, table

LOST = "dc1"
POLL_S = 0.05  # how often the bench reads the status page while it waits for the detection (a measurement's)


@dataclass(frozen=True)
class RecoveryPlan:
    """The job's settings: the one place they are chosen. dc0 trains until the restarted dc1's first outer round
    is in (a file it writes), then ``after_rounds`` more, at most ``max_rounds`` in all; ``die_step``: dc1's step
    when it is killed (mid-round)."""

    preset: str = "gpt85m"
    h: int = 100
    step_ms: float = 40.0
    max_rounds: int = 100
    after_rounds: int = 2
    die_step: int = 150
    heartbeat_s: float = 5.0
    timeout_s: float = 900.0

    @property
    def rejoined_steps(self) -> int:
        """The restarted party's steps: two outer rounds."""
        return 2 * self.h


PLAN = RecoveryPlan()


def topology(plan: RecoveryPlan, status_port: int) -> dict[str, Any]:
    """2 collective parties of 2 ranks, blocking DiLoCo rounds, the heartbeat timeout of the plan, the status page
    at ``status_port`` (the bench reads it)."""
    return {"parties": {f"dc{p}": {"workers": 2, "lan": "collective"} for p in range(2)}, "central": "dc0",
            "hfa": {"k1": plan.h, "k2": 1}, "training": {"server_optimizer": "outer_nesterov"},
            "status": {"host": "127.0.0.1", "port": status_port},
            "timeouts": {"register": "300s", "request": "600s", "round": "600s", "shutdown": "120s",
                         "heartbeat": f"{plan.heartbeat_s:g}s", "heartbeat_interval": "0.5s"}}


def worker(plan: RecoveryPlan, out: Path, steps: int, *extra: str) -> list[str]:
    """A rank's command: the scale section's worker with the plan's model and steps (``extra``: its flags)."""
    return [sys.executable, "-m", "geomx.bench.workers.scale_step", "--preset", plan.preset, "--steps", str(steps),
            "--step-ms", str(plan.step_ms), "--out", str(out), *extra]


def party_states(address: str, party: str) -> list[str]:
    """The states (``training``, ``dead``, ``rejoining``, ...) of ``party``'s members on the status page."""
    with urllib.request.urlopen(f"http://{address}/status.json", timeout=5) as answer:
        page = json.loads(answer.read())
    return [m["state"] for p in page["parties"] if p["name"] == party for m in p["members"]]


def wait_dead(address: str, party: str, timeout_s: float) -> float:
    """When the status page first showed every member of ``party`` dead (wall clock); RuntimeError past
    ``timeout_s``."""
    give_up = time.monotonic() + timeout_s
    while time.monotonic() < give_up:
        states = party_states(address, party)
        if states and all(state == "dead" for state in states):
            return time.time()
        time.sleep(POLL_S)  # polling a page for a measurement, not waiting for a process
    raise RuntimeError(f"{party} was not declared dead within {timeout_s:g} s")


def parts(ranks: dict[int, dict[str, Any]], rejoined: list[int], killed_at: float, dead_at: float,
          restarted_at: float, h: int) -> dict[str, Any]:
    """The recovery's parts from the restarted ranks' ``times`` (each part's end: the later of the two ranks)."""
    def last(stage: str) -> float:
        return max(ranks[r]["times"][stage] for r in rejoined)

    first = max(ranks[r]["started_at"] + ranks[r]["step_ends"][h - 1] for r in rejoined)
    model_bytes = ranks[rejoined[0]]["model_bytes"]
    state_s = max(ranks[r]["init_s"] for r in rejoined)
    return {"detection_s": dead_at - killed_at, "reform_s": last("joined") - restarted_at,
            "imports_s": last("main") - restarted_at, "model_s": last("model") - last("main"),
            "setup_s": last("setup") - last("model"), "join_s": last("joined") - last("setup"),
            "wrapper_s": last("ready") - last("joined"), "state_s": state_s, "model_mb": model_bytes / 1e6,
            "state_mb_per_s": model_bytes / 1e6 / state_s,
            "first_contribution_s": first - last("ready"), "rejoin_s": first - restarted_at,
            "kill_to_contribution_s": first - killed_at}


def measure(plan: RecoveryPlan, out_dir: Path) -> dict[str, Any]:
    """The section's dict: the job's parts (``record``), or ``errors``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    section: dict[str, Any] = {"plan": asdict(plan), "records": {}, "errors": [], "load_avg_start": load_avg()}
    out = out_dir / "ranks" / "recovery"
    contributed = out / "contributed"
    fresh(out).mkdir(parents=True, exist_ok=True)
    contributed.unlink(missing_ok=True)
    longest = plan.h * plan.max_rounds
    status_port, address = free_port(), f"127.0.0.1:{free_port()}"
    path = write_topology(out_dir / "topologies" / "recovery.yaml", topology(plan, status_port))
    results: dict[str, LaunchResult] = {}
    survivor = worker(plan, out, longest, "--until-file", str(contributed), "--after", str(plan.h * plan.after_rounds))
    dc0 = threading.Thread(target=launch_party, args=("dc0", "dc0", path, survivor, address, out_dir, results),
                           kwargs={"section": "recovery"})
    try:
        say(f"[recovery] dc0 and dc1 start; dc1 is killed at its step {plan.die_step} ...")
        dc0.start()
        launch_party("lost", LOST, path, worker(plan, out, longest, "--die-step", str(plan.die_step)), address,
                     out_dir, results, section="recovery")  # returns once dc1's processes are dead
        killed_at = read_fault(out)["at"]
        dead_at = wait_dead(f"127.0.0.1:{status_port}", LOST, plan.timeout_s)
        restarted_at = time.time()
        launch_party("rejoined", LOST, path, worker(plan, out, plan.rejoined_steps, "--contributed-file",
                                                    str(contributed)), address, out_dir, results, section="recovery")
        dc0.join(timeout=plan.timeout_s)
        failed = [f"{label} ({r.failed})" for label, r in results.items() if label != "lost" and r.exit_code != 0]
        if failed or dc0.is_alive():
            raise RuntimeError(f"{', '.join(failed) or 'dc0 did not end'}; see {out_dir / 'logs'}")
        if not contributed.exists():
            raise RuntimeError(f"the restarted {LOST} finished no outer round while dc0 trained")
        ranks = read_ranks(out)
        record = parts(ranks, [2, 3], killed_at, dead_at, restarted_at, plan.h)
        record["others_stalled_s"] = longest_stall_s(ranks, [0, 1])
        record["goal"] = {"rejoin_s": 30.0, "state_s": 2.0}
        section["records"]["recovery"] = record
        section["ranks"] = without_step_ends(ranks)
    except (RuntimeError, OSError, KeyError, IndexError, ValueError) as exc:
        section["errors"].append(f"recovery: {exc}")
        say(f"[recovery] FAILED: {exc}")
    except KeyboardInterrupt:
        section["interrupted"] = True
        raise Interrupted(section) from None
    section["load_avg_end"] = load_avg()
    return section


def run(plan: BenchPlan, out_dir: Path) -> dict[str, Any]:
    """The section's entry point (``--quick`` runs the same job: it takes a few minutes)."""
    return measure(PLAN, out_dir)


def lines(section: dict[str, Any]) -> list[str]:
    """The section's table for ``geomx bench``'s report."""
    p = section["plan"]
    out = [f"[recovery] 2 parties x 2 ranks, {p['preset']} stand-in ({p['step_ms']:g} ms steps), DiLoCo H = {p['h']}, "
           f"loopback; dc1 killed at step {p['die_step']}, heartbeat {p['heartbeat_s']:g} s; load avg "
           f"{section.get('load_avg_start')} -> {section.get('load_avg_end')}"]
    for record in section["records"].values():
        goal = record["goal"]
        cells = [["detection", fmt(record["detection_s"], ".1f"), "kill -> declared dead", ""],
                 ["re-forming", fmt(record["reform_s"], ".1f"),
                  f"imports {fmt(record['imports_s'], '.1f')}, model {fmt(record['model_s'], '.1f')}, stand-in "
                  f"{fmt(record['setup_s'], '.1f')}, group + admission {fmt(record['join_s'], '.1f')}", ""],
                 ["wrapper's start", fmt(record["wrapper_s"], ".2f"), "its INIT (below), DiLoCo's copy of the model",
                  ""],
                 ["  state", fmt(record["state_s"], ".2f"),
                  f"{fmt(record['model_mb'], '.0f')} MB at {fmt(record['state_mb_per_s'], '.0f')} MB/s",
                  f"<= {goal['state_s']:g}"],
                 ["first contribution", fmt(record["first_contribution_s"], ".1f"), "H steps and the round trip", ""],
                 ["rejoin", fmt(record["rejoin_s"], ".1f"), "restart -> first contribution",
                  f"<= {goal['rejoin_s']:g}"],
                 ["others stalled", fmt(record["others_stalled_s"], ".1f"), "dc0's longest pause", ""]]
        out += table(["part", "s", "what", "goal"], cells)
    out += [f"error: {e}" for e in section.get("errors", [])]
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m geomx.bench.recovery [--out OUT]``: OUT/recovery.json and the table; the flags are parsed before
    anything starts (``--help``, a misspelt flag: exit 2), a stop is ``geomx bench``'s (``geomx.bench.alone``)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m geomx.bench.recovery",
                                     description="the recovery section alone (geomx bench --only recovery): the "
                                                 "same job, which --quick does not shorten")
    add_out(parser, "recovery")
    out_dir = Path(parser.parse_args(argv).out)
    return run_alone("recovery", lambda: measure(PLAN, out_dir), out_dir, lines)


if __name__ == "__main__":
    sys.exit(main())
