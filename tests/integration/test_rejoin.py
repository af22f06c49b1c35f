"""A party lost and taken back, and WAN outages (real processes; per-party launches, as on separate hosts).

* **Killed, restarted, rejoined** (HFA, and ESync: HFA rounds whose length the state round assigns): every
  process of dc1 gets SIGKILL in the middle of training. The global scheduler declares dc1/server dead within
  the heartbeat timeout, the global server drops it, dc0 trains on. dc1 is started again at once with the same
  party name: its local server waits until the old one is declared dead, registers in its place, and the global
  server takes it as a client. Its worker's ``init`` returns the *current* global model (one dc0 pulled after
  dc1 died, not the master's initial weights) and from then on the global rounds include it again. Everyone ends
  normally; the global scheduler exits 0 (the job is whole).
* The same under SSP, elastic FSA (a round of every step: the restarted party's pushes are held until the step's
  round under way has ended on every key, ``geomx.core.joiners``), DiLoCo with a quorum of every party (it shrinks
  to dc0 while dc1 is lost) and streaming fragments with a quorum of one; under a quorum the global server's round
  report shows dc1 lost, then back.
* **A rank of a collective party killed under ``torchrun --max-restarts 1``**: torchrun's agent restarts the party's
  ranks and they rejoin as the party, while the server party trains on.
* **Cut off, dropped, restarted** (MixedSync): the WAN emulator cuts dc1 off for longer than the heartbeat
  timeout. dc1 is dropped; when the WAN comes back dc1/server hears it was declared dead and stops, naming why,
  and dc1's worker fails with that message. Restarted, dc1 rejoins as above (its ``init`` gets each key's
  current value; the asynchronous tier has no cross-key snapshot, so keys may be one of dc0's steps apart).
* **A short outage** (FSA) only delays: every step waits for dc1, and the result is still exactly the
  single-process run.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import jobkit
import pytest
import torch
import yaml
from harness import Job, run_job, worker_command, write_topology

from geomx.runs.runlog import read_stats

# cold: a worker SIGKILLs its party's processes, found by their /proc environ (a warm worker's is its server's)
pytestmark = pytest.mark.cold_workers

HEARTBEAT_S = 3.0
TIMEOUTS = {"heartbeat": f"{HEARTBEAT_S:g}s", "heartbeat_interval": "0.25s", "round": "60s", "request": "60s",
            "shutdown": "20s"}


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def syncs(pulled: list[torch.Tensor], per: int) -> list[list[torch.Tensor]]:
    """The flat list of pulled tensors, cut into one model per sync."""
    return [pulled[i:i + per] for i in range(0, len(pulled), per)]


def with_outage(path: Path, party: str, start: float, duration: float) -> Path:
    """``path`` plus an outage of ``party`` ``start`` seconds after each process's first training message."""
    raw = yaml.safe_load(path.read_text())
    raw["outages"] = [{"party": party, "start": f"{start:g}s", "duration": f"{duration:g}s", "from": "training"}]
    cut = path.with_name(f"{path.stem}-outage.yaml")
    cut.write_text(yaml.safe_dump(raw, sort_keys=False))
    return cut


# Decoupled outer rounds (``training``): DiLoCo with a quorum of every party, which shrinks to the live ones while
# dc1 is lost; streaming with a quorum of one, its answers landing when they arrive
DECOUPLED = {"diloco": {"quorum": 2, "grace": "auto"},
             "streaming": {"quorum": 1, "grace": "0", "stale_rounds": 4, "fragments": 2}}
HFA = {"hfa": {"k1": 2, "k2": 1}, "esync": {"k1": 2, "k2": 1}, "diloco": {"k1": 2, "k2": 1},
       "streaming": {"k1": 2, "k2": 2}, "streaming_blocking": {"k1": 2, "k2": 2}}
# streaming without a quorum: every fragment's round waits for every party, nothing overlapped; a party back in the
# middle of the others' cycle is held until its end (``geomx.core.joiners``), so that its first fragment meets theirs
BLOCKING = {"streaming_blocking": {"fragments": 2}}
STREAMING = ("streaming", "streaming_blocking")
PER_KEY = ("mixed", "ssp")  # asynchronous or bounded-stale global tiers: each key moves on its own


def outer_rounds_of(job: Job) -> dict:
    """The global server's report of its decoupled rounds (its stats file)."""
    [report] = [s["outer_rounds"] for s in read_stats(job.run_dir) if "outer_rounds" in s]
    return report


@pytest.mark.slow
@pytest.mark.parametrize(("lost_by", "algorithm"), [("kill", "hfa"), ("kill", "esync"), ("outage", "mixed"),
                                                    ("kill", "diloco"), ("kill", "streaming"), ("kill", "ssp"),
                                                    ("kill", "fsa_elastic"), ("kill", "streaming_blocking")])
def test_a_lost_party_restarts_and_rejoins_with_the_current_model(tmp_path, reserved_port, lost_by, algorithm):
    topology = write_topology(tmp_path / "rejoin.yaml", parties={"dc0": 1, "dc1": 1}, timeouts=TIMEOUTS,
                              hfa=HFA.get(algorithm), training=DECOUPLED.get(algorithm, BLOCKING.get(algorithm)))
    if algorithm == "fsa_elastic":
        topology.write_text(topology.read_text() + "elastic: true\n")
    kind = {"mixed": ("--kind", "dist_async"), "ssp": ("--kind", "dist_ssp"), "esync": ("--esync",),
            "diloco": ("--outer",)}.get(algorithm, ())
    rejoined = tmp_path / "rejoined"
    global_scheduler = f"127.0.0.1:{reserved_port()}"
    jobs: dict[str, Job] = {}

    def launch(label: str, party: str, *args: str, job_topology: Path = topology) -> None:
        jobs[label] = run_job(tmp_path, "rejoin_train.py", *kind, *args, name=label, party=party,
                              global_scheduler=global_scheduler, topology=job_topology)

    survivor = threading.Thread(target=launch, args=("survivor", "dc0", "--until-file", str(rejoined),
                                                     "--after", "10"))
    survivor.start()
    if lost_by == "kill":
        launch("lost", "dc1", "--steps", "1000", "--die-step", "6")  # returns once dc1's processes are dead
    else:  # the outage starts 8 s into dc1's training (``from: training``) and outlasts the heartbeat timeout
        launch("lost", "dc1", "--steps", "2000", job_topology=with_outage(topology, "dc1", 8.0, HEARTBEAT_S + 2))
    launch("rejoining", "dc1", "--steps", "12", "--rejoined-file", str(rejoined))
    survivor.join(timeout=180)
    assert not survivor.is_alive(), "dc0's launcher did not return"

    lost, rejoining, dc0 = jobs["lost"], jobs["rejoining"], jobs["survivor"]
    assert lost.result.exit_code != 0 and not lost.workers(), lost.tail()
    if lost_by == "outage":  # back on the WAN, dc1 learns it was dropped; its worker's error says so
        assert "[dc1/server] dc1/server was declared dead" in lost.output or \
            "global_scheduler has not answered heartbeats" in lost.output, lost.tail()
        assert "restart its party to rejoin" in lost.output
    rejoining.assert_ok()
    dc0.assert_ok()  # the global scheduler exits 0: the member it lost was replaced
    assert "rejoins in place of the one declared dead" in dc0.output
    assert "dc1/server rejoined" in dc0.output, dc0.tail()
    assert "dropped dc1/server from the rounds" in dc0.output, dc0.tail()

    (dc0_tensors, _), = dc0.workers().values()
    (new_tensors, new_report), = rejoining.workers().values()
    per = len(new_tensors["final"])
    dc0_models = syncs(dc0_tensors["pulled"], per)
    new_models = syncs(new_tensors["pulled"], per)
    # The restarted worker started from the current global model: one dc0 pulled after dc1 was lost (dc0's
    # first syncs still had dc1 in them), neither its own random weights nor the master's initial ones.
    start = new_tensors["after_init"]
    assert not same(start, new_tensors["before_init"])
    assert not same(start, dc0_tensors["after_init"])
    if algorithm in PER_KEY or algorithm == "fsa_elastic":  # ``init`` may read key 0 after dc0's push of step t
        # and key 3 after step t + 1 (under FSA: a round of every step, the INIT answered in the middle of one);
        # every key is one dc0 pulled, none a first one
        firsts = [next((i for i, model in enumerate(dc0_models) if torch.equal(model[k], start[k])), None)
                  for k in range(per)]
        assert None not in firsts and min(firsts) >= 3, (firsts, len(dc0_models))
    elif algorithm not in STREAMING:  # synchronous global rounds: the whole model is one dc0 pulled (streaming's
        # pulls are mostly local averages, its fragments' global models landing one at a time)
        matches = [i for i, model in enumerate(dc0_models) if same(model, start)]
        assert matches and matches[0] >= 3, (matches, len(dc0_models))
    per_step = algorithm in (*PER_KEY, "fsa_elastic")
    assert new_report["syncs"] == (12 if per_step else 12 // 2 if algorithm != "esync" else new_report["syncs"]) > 0
    assert not same(new_tensors["final"], start)
    if algorithm not in (*PER_KEY, *STREAMING):
        # after the rejoin both parties were in the same global rounds: they pulled the same averages
        common = [m for m in new_models if any(same(m, d) for d in dc0_models)]
        assert len(common) >= 3, (len(common), len(new_models))
    if algorithm in DECOUPLED:  # the rounds' status: dc1 lost, then back in them
        dc1 = outer_rounds_of(dc0)["by_party"]["dc1/server"]
        assert dc1["lost"] > 0 and dc1["on_time"] + dc1["late_folded"] > 0, dc1
        if algorithm == "diloco":  # its first push after the rejoin is on time (late by the rounds since its INIT)
            assert dc1["dropped"] == 0, dc1


@pytest.mark.slow
def test_a_short_outage_only_delays_fsa(geomx_job, tmp_path):
    """dc1 is cut off for 2 s (less than the heartbeat timeout) in the middle of an FSA run: no step ends
    while it is cut off, nobody is declared dead, and the model is still exactly the single-process one.

    The outage counts from training (``from: training``: each process's first PUSHPULL), not from the launch,
    so however long start-up takes on a loaded machine it falls 2 s into training."""
    start, duration, steps = 2.0, 2.0, 120
    topology = write_topology(tmp_path / "fsa.yaml", parties={"dc0": 1, "dc1": 1},
                              timeouts={**TIMEOUTS, "heartbeat": "8s"})
    job = geomx_job("rejoin_train.py", "--steps", str(steps), "--step-seconds", "0.05",
                    topology=with_outage(topology, "dc1", start, duration))
    job.assert_ok()
    assert " is dead" not in job.output
    workers = job.workers()
    _, expected = jobkit.reference_run(2, steps=steps, momentum=0.0)
    for tensors, _ in workers.values():
        for got, want in zip(tensors["final"], expected, strict=True):
            torch.testing.assert_close(got, want)
    # each process's outage clock started at its first PUSHPULL: after the first worker's first push, and
    # before the first sync ended (that round needed every server's push)
    reports = [report for _, report in workers.values()]
    ends = reports[0]["sync_ends"]
    first, synced = min(r["first_push"] for r in reports), min(r["sync_ends"][0] for r in reports)
    assert first < synced, reports
    assert ends[-1] > synced + start + duration, "training ended before the outage did"
    during = [t for t in ends if synced + start + 0.3 < t < first + start + duration]
    assert not during, f"{len(during)} steps ended while dc1 was cut off"
    gap = max(b - a for a, b in itertools.pairwise(ends))
    assert gap >= duration - 0.4, gap


@pytest.mark.slow
def test_esync_over_two_global_servers_refuses_a_rejoin_and_goes_on(tmp_path, reserved_port):
    """Only global server 0 sees ESync's state rounds, which a rejoiner needs to be aligned with the others'
    cycle: with two global servers the restarted dc1 is refused with that reason (never a hang), and dc0
    trains on alone and finishes."""
    topology = write_topology(tmp_path / "esync2.yaml", parties={"dc0": 1, "dc1": 1}, timeouts=TIMEOUTS,
                              hfa={"k1": 2, "k2": 1}, global_servers=2)
    refused = tmp_path / "refused"
    global_scheduler = f"127.0.0.1:{reserved_port()}"
    jobs: dict[str, Job] = {}

    def launch(label: str, party: str, *args: str) -> None:
        jobs[label] = run_job(tmp_path, "rejoin_train.py", "--esync", *args, name=label, party=party,
                              global_scheduler=global_scheduler, topology=topology)

    survivor = threading.Thread(target=launch, args=("survivor", "dc0", "--until-file", str(refused),
                                                     "--after", "4"))
    survivor.start()
    launch("lost", "dc1", "--steps", "1000", "--die-step", "6")
    launch("rejoining", "dc1", "--steps", "12")
    refused.write_text("the rejoin returned")
    survivor.join(timeout=180)
    assert not survivor.is_alive(), "dc0's launcher did not return"
    rejoining, dc0 = jobs["rejoining"], jobs["survivor"]
    assert rejoining.result.exit_code != 0 and not rejoining.workers(), rejoining.tail()
    assert "cannot rejoin" in rejoining.output and "ESync with several global servers" in rejoining.output, \
        rejoining.tail()
    assert dc0.workers(), dc0.tail()  # dc0's worker finished its training
    assert "dropped dc1/server from the rounds" in dc0.output, dc0.tail()


@pytest.mark.slow
@pytest.mark.parametrize("training", [None, DECOUPLED["diloco"]], ids=["hfa", "quorum_of_every_party"])
def test_a_collective_party_killed_restarts_and_its_ranks_rejoin_with_the_current_model(tmp_path, reserved_port,
                                                                                        training):
    """HFA (K1=2, K2=1): dc0 a server party of one worker, dc1 a collective party of two ranks. dc1's rank 1 dies;
    its rank 0 fails at its next collective, naming the party; the global tier drops dc1 and dc0 trains on. dc1 is
    started again: each rank rejoins in place of the dead rank of its RANK, the party speaks as a new client, its
    init brings the *current* global model (each key as dc0 held it after dc1 was lost), and later global rounds
    include it. Under decoupled rounds the report counts the party by its name across both lives: lost, then back."""
    path = write_topology(tmp_path / "rejoin.yaml", parties={"dc0": 1, "dc1": 2}, timeouts=TIMEOUTS,
                          hfa={"k1": 2, "k2": 1}, training=training)
    raw = yaml.safe_load(path.read_text())
    raw["parties"]["dc1"]["lan"] = "collective"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    rejoined = tmp_path / "rejoined"
    global_scheduler = f"127.0.0.1:{reserved_port()}"
    jobs: dict[str, Job] = {}

    def launch(label: str, party: str, *args: str) -> None:
        jobs[label] = run_job(tmp_path, "collective_rejoin_train.py", *args, name=label, party=party,
                              global_scheduler=global_scheduler, topology=path)

    survivor = threading.Thread(target=launch, args=("survivor", "dc0", "--until-file", str(rejoined),
                                                     "--after", "20"))  # room for rank 1's own init under load
    survivor.start()
    launch("lost", "dc1", "--steps", "1000", "--die-rank", "2", "--die-step", "6")  # global rank 2: dc1's rank 1
    launch("rejoining", "dc1", "--steps", "12", "--rejoined-file", str(rejoined))
    survivor.join(timeout=180)
    assert not survivor.is_alive(), "dc0's launcher did not return"

    lost, rejoining, dc0 = jobs["lost"], jobs["rejoining"], jobs["survivor"]
    assert lost.result.exit_code != 0 and not lost.workers(), lost.tail()
    assert "party dc1: rank 0's" in lost.output, lost.tail()  # the surviving rank's collective failed, named
    rejoining.assert_ok()
    dc0.assert_ok()  # the global scheduler exits 0: the members it lost were replaced
    assert dc0.output.count("rejoins in place of the one declared dead") == 2, dc0.tail()
    assert "dropped dc1/worker" in dc0.output, dc0.tail()

    (dc0_tensors, _), = dc0.workers().values()
    new = rejoining.workers()
    assert sorted(new) == [1, 2], sorted(new)
    per = len(dc0_tensors["final"])
    dc0_models = syncs(dc0_tensors["job_models"], per)
    for tensors, _ in new.values():
        assert same(tensors["after_init"], new[1][0]["after_init"]) and same(tensors["final"], new[1][0]["final"])
    start = new[1][0]["after_init"]
    assert not same(start, new[1][0]["before_init"]) and not same(start, dc0_tensors["after_init"])
    # each key is a global model's from after dc1 was lost; not always one model's: each rank INITs the slices it
    # owns, and dc0's rounds go on meanwhile, so a key may come from the next round (seen once under load)
    for key, value in enumerate(start):
        matches = [i for i, model in enumerate(dc0_models) if torch.equal(model[key], value)]
        assert matches and matches[0] >= 3, (key, matches, len(dc0_models))
    common = [m for m in syncs(new[1][0]["job_models"], per) if any(same(m, d) for d in dc0_models)]
    assert len(common) >= 3, (len(common), len(dc0_models))  # global rounds with both parties in them
    if training is not None:  # the rounds' status: dc1 lost, then back in them, by the party's client's name
        report = outer_rounds_of(dc0)
        assert sorted(report["by_party"]) == ["dc0/server", "dc1/ranks"], report["by_party"]
        assert report["by_party"]["dc1/ranks"]["lost"] > 0 and report["by_party"]["dc1/ranks"]["on_time"] > 0, report
        assert report["last_rounds"][-1]["lost"] == [], report["last_rounds"][-1]


@pytest.mark.slow
def test_a_collective_party_under_torchrun_max_restarts_survives_a_killed_rank(tmp_path, reserved_port):
    """docs/collective.md's own-torchrun recipe with ``--max-restarts 1`` for dc1 (two ranks, HFA K1=2, K2=1, beside
    server party dc0): dc1's rank 1 gets SIGKILL at step 6. torchrun's elastic agent stops rank 0 and starts both
    again (``TORCHELASTIC_RESTART_COUNT=1``); each rank takes the place of its predecessor once the global scheduler
    has declared that one dead, the party rejoins with the current global model while dc0 trains on, and the job
    ends with both parties training: torchrun exits 0, dc0's launch too. ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``,
    as the docs say: with the agent's shared store the restarted rank 0 read its first attempt's peer address there
    and failed (gloo: connection refused; pytorch/pytorch#135712), and geomx now refuses that at the first start."""
    path = write_topology(tmp_path / "torchrun.yaml", parties={"dc0": 1, "dc1": 2}, timeouts=TIMEOUTS,
                          hfa={"k1": 2, "k2": 1}, lan={"dc1": "collective"})
    rejoined = tmp_path / "rejoined"
    global_scheduler = f"127.0.0.1:{reserved_port()}"
    jobs: dict[str, Job] = {}

    def survive() -> None:
        jobs["dc0"] = run_job(tmp_path, "collective_rejoin_train.py", "--until-file", str(rejoined), "--after", "20",
                              name="survivor", party="dc0", global_scheduler=global_scheduler, topology=path)

    survivor = threading.Thread(target=survive)
    survivor.start()
    run_dir = tmp_path / "run-dc1"
    env = {**os.environ, "GEOMX_TOPOLOGY": str(path), "GEOMX_PARTY": "dc1", "GEOMX_GLOBAL_SCHEDULER": global_scheduler,
           "GEOMX_HOST": "127.0.0.1", "GEOMX_RUN_DIR": str(run_dir), "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    script = worker_command("collective_rejoin_train.py", "--steps", "12", "--die-rank", "2", "--die-step", "6",
                            "--torchrun-restarts", "--rejoined-file", str(rejoined))[1:]
    torchrun = [str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc-per-node=2",
                "--max-restarts=1", *script]
    dc1 = subprocess.Popen(torchrun, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           start_new_session=True)
    try:
        output = dc1.communicate(timeout=240)[0]
    finally:
        if dc1.poll() is None:
            os.killpg(dc1.pid, signal.SIGKILL)
            dc1.wait()
        if not rejoined.exists():  # dc1 never came back: let dc0's loop end now
            rejoined.write_text("never")
    survivor.join(timeout=180)
    assert not survivor.is_alive(), "dc0's launcher did not return"
    assert dc1.returncode == 0, output[-4000:]
    assert rejoined.read_text() != "never", output[-4000:]  # written by rank 0 of torchrun's second attempt
    dc0 = jobs["dc0"]
    dc0.assert_ok()  # the global scheduler exits 0: the members it lost were replaced
    assert dc0.output.count("rejoins in place of the one declared dead") == 2, dc0.tail()
    assert "dropped dc1/worker" in dc0.output, dc0.tail()

    (dc0_tensors, _), = dc0.workers().values()
    new = jobkit.load_worker_outputs(run_dir)
    assert sorted(new) == [1, 2], sorted(new)
    for tensors, report in new.values():
        assert report["steps"] == 12, report
        assert same(tensors["final"], new[1][0]["final"])
    start = new[1][0]["after_init"]
    assert not same(start, new[1][0]["before_init"]) and not same(start, dc0_tensors["after_init"])
    per = len(dc0_tensors["final"])
    dc0_models = syncs(dc0_tensors["job_models"], per)
    common = [m for m in syncs(new[1][0]["job_models"], per) if any(same(m, d) for d in dc0_models)]
    assert len(common) >= 3, (len(common), len(dc0_models))  # global rounds with both parties in them
