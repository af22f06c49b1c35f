"""The algorithms beyond FSA and HFA in ``lan: collective`` parties: MixedSync, MixedSync + DCASGD and SSP (each
party's reduce-scattered sum goes up slice by slice, owner by owner, and the global server applies or answers it
by the policy's rule, the party's ranks counting as one client; their order is the servers', so each test
rebuilds it or checks what holds in every order), and ESync (the party is one worker of it)."""

from __future__ import annotations

import json
from pathlib import Path

import jobkit
import numpy as np
import torch
from harness import write_topology

SCRIPT = "frontend_train.py"
COLLECTIVE = {"dc0": "collective", "dc1": "collective"}
PARTY_RANKS = {"dc0": (0, 1), "dc1": (2, 3)}


def assert_a_party_holds_every_push_once(workers, rtol: float) -> None:
    """Plain SGD on the global servers, answering with weights: a party's ranks end equal (the same answers,
    all-gathered), and per element one party or the other (each slice is answered last to one of them: its owners
    push on their own) holds ``initial - lr * (sum of every rank's gradients) / N``, every push applied once."""
    assert {report["mode"] for _, report in workers.values()} == {"SERVER"}
    for first, second in PARTY_RANKS.values():
        for a, b in zip(workers[first][0]["final"], workers[second][0]["final"], strict=True):
            assert torch.equal(a, b), (first, second)
    initial = workers[0][0]["after_init"]
    total = [sum(tensors["pushed"][i] for tensors, _ in workers.values()) for i in range(len(initial))]
    for index, (w0, g) in enumerate(zip(initial, total, strict=True)):
        want = w0 - jobkit.LR * g / 4
        held = [torch.isclose(workers[rank][0]["final"][index], want, rtol=rtol, atol=1e-6) for rank in (0, 2)]
        assert torch.all(held[0] | held[1]), f"parameter {index}: no party holds every push applied once"


def test_mixed_sync_in_collective_parties_applies_every_push_once_with_fsdp2(geomx_job, tmp_path):
    """MixedSync across two collective parties whose model FSDP2 shards (384-element slices across the shards'
    boundaries): each rank pushes the party's sum of the gradient slices it owns, from its shards, and the servers'
    weights go back into them. Plain SGD on the server: the party answered last ends at ``initial - lr * (sum of
    every rank's gradients) / N``, whatever order the pushes came in (none lost, none twice), slice by slice, and a
    party's ranks end equal. (The script records each rank's sum of FSDP2's party-mean gradients: over a party
    they add up to what it pushed.) SSP and DCASGD run the same ranks' steps (``ShardedServerStep``; they differ
    on the servers), tested below without FSDP2."""
    path = write_topology(tmp_path / "job.yaml", lan=COLLECTIVE, slice_elems=384,
                          training={"sync": "dist_async", "server_optimizer": "translate"})
    job = geomx_job("fsdp_train.py", "--fsdp", "--record", topology=path)
    job.assert_ok()
    workers = job.workers()
    assert all(report["fsdp"] for _, report in workers.values())
    assert_a_party_holds_every_push_once(workers, rtol=1e-4)


STEPS = 8
LAMDA = 20.0  # large (MXNet's default is 0.04), so that a wrong backup shows far above float32 rounding
SLOW = ["--step-s", "0.05", "--slow-rank", "2", "--slowdown", "3"]  # dc1's steps take 3x dc0's


def party_steps(workers, party: str, key: int, lo: int, hi: int) -> list[tuple[np.ndarray, ...]]:
    """Per step of ``party``, elements ``[lo, hi)`` of ``key`` (one slice): the weights it computed on, the party's
    gradient as the server scales it (the ranks' sum / 4) and the weights it received; float64."""
    ranks = PARTY_RANKS[party]
    keys = len(workers[0][0]["final"])
    steps = []
    for step in range(STEPS):
        at = step * keys + key
        first = workers[ranks[0]][0]
        for rank in ranks[1:]:  # a party's ranks hold one model: the same weights before and after every step
            assert torch.equal(workers[rank][0]["held"][at], first["held"][at]), (party, step, key)
            assert torch.equal(workers[rank][0]["received"][at], first["received"][at]), (party, step, key)
        grad = sum(workers[r][0]["grad"][at].double() for r in ranks).numpy().ravel() / 4
        steps.append((first["held"][at].double().numpy().ravel()[lo:hi], grad[lo:hi],
                      first["received"][at].double().numpy().ravel()[lo:hi]))
    return steps


def test_dcasgd_in_collective_parties_replays_with_one_backup_per_party(geomx_job, tmp_path):
    """MixedSync + DCASGD over two collective parties of two ranks, dc1 3x slower: every slice's pushes replay as
    the paper's update with one backup per party (the client its ranks speak as), seeded at INIT; a backup per
    rank, or none before a party's first push, does not replay. Some push must need the compensation."""
    path = write_topology(tmp_path / "job.yaml", lan=COLLECTIVE, slice_elems=512,
                          training={"sync": "dist_async", "server_optimizer": f"dcasgd:lamda={LAMDA}"})
    job = geomx_job(SCRIPT, "--momentum", "0", "--record", "--steps", str(STEPS), *SLOW, topology=path)
    job.assert_ok()
    workers = job.workers()
    assert {report["mode"] for _, report in workers.values()} == {"SERVER"}
    compensated = 0
    for key, slices in enumerate(workers[0][1]["slices"]):
        for lo, hi, *_ in slices:
            parties = {party: party_steps(workers, party, key, lo, hi) for party in PARTY_RANKS}
            order, plain_fits = jobkit.dcasgd_order(parties, jobkit.LR, LAMDA, f"key {key} [{lo}, {hi})")
            assert sorted(order) == ["dc0"] * STEPS + ["dc1"] * STEPS, order
            compensated += plain_fits.count(False)
    assert compensated > 0, "no push was stale: the job never exercised the compensation"


def test_ssp_in_collective_parties_bounds_the_fast_party_and_applies_every_push_once(geomx_job, tmp_path):
    """SSP (staleness 2) over two collective parties, dc1 3x slower: the global server answers dc0's ranks up to 2
    rounds ahead of the last completed round, never more (nor dc1's: a slice's owner in dc0 may be late under
    load); every slice's pushes are summed and applied once (plain SGD), so the party answered last at each
    slice's last round, its ranks equal, ends at ``initial - lr * (every rank's gradients) / N`` there."""
    staleness = 2
    path = write_topology(tmp_path / "job.yaml", lan=COLLECTIVE, slice_elems=512,
                          training={"sync": "dist_ssp", "staleness": staleness, "server_optimizer": "translate"})
    job = geomx_job(SCRIPT, "--momentum", "0", "--steps", str(STEPS), *SLOW, topology=path)
    job.assert_ok()
    stats = json.loads((Path(job.run_dir) / "stats" / "global_server0.json").read_text())
    leads = {name.split("/")[0]: {int(ahead) for ahead in counts} for name, counts in stats["answer_leads"].items()}
    assert sorted(leads) == ["dc0", "dc1"], stats["answer_leads"]
    assert max(leads["dc0"]) == staleness, leads  # the fast party ran ahead, up to the bound
    assert max(leads["dc1"]) <= staleness, leads
    assert_a_party_holds_every_push_once(job.workers(), rtol=1e-5)


def esync_job_with_a_slow_party(geomx_job, tmp_path: Path, *args: str) -> dict:
    """ESync (K1 = 2, K2 = 1), dc0 a collective party of two ranks, dc1 a server party of one 4x slower worker (the
    script's ``args`` added): dc0 trains all 7 steps, dc1 fewer, every worker ends on one model. Returns the
    workers' outputs. (Two collective parties, the slow one collective: the FSDP2 test below.)"""
    parties = {"dc0": 2, "dc1": 1}
    path = write_topology(tmp_path / "job.yaml", parties=parties, lan={"dc0": "collective"}, hfa={"k1": 2, "k2": 1},
                          training={"esync": True})
    # 0.1 s of emulated device time per step, 0.8 s on the slow rank: on a loaded machine the real compute, the same
    # for both parties, adds to both, and a smaller gap than this closed (both parties got the same assignment)
    job = geomx_job(SCRIPT, "--steps", "7", "--momentum", "0", "--step-s", "0.1", "--slow-rank", "2",
                    "--slowdown", "8", *args, topology=path)
    job.assert_ok()
    workers = job.workers()
    assert sorted(workers) == list(range(sum(parties.values())))
    trained = {rank: report["trained_steps"] for rank, (_, report) in workers.items()}
    # the fast party's assignment follows measured step times (noisy under load): checked loosely
    assert trained[0] == trained[1] == 7 and all(trained[rank] < 7 for rank in range(2, len(trained))), trained
    jobkit.assert_one_trained_model(workers, "ESYNC")
    return workers


def test_esync_in_a_collective_party_beside_a_server_party_ends_together(geomx_job, tmp_path):
    """The state server gives dc0 (one worker of ESync, its rank 0 speaking) more local steps per round. Its data
    (7 steps) ends first, the end-of-data flag its control slice's owner sends makes that round the last, and dc1
    trains fewer steps; every worker ends with the same (global) model. With K1 steps for everyone, or without the
    flag (dc1 trains on alone once dc0 has left), dc1 would train all 7."""
    esync_job_with_a_slow_party(geomx_job, tmp_path)


def test_esync_with_fsdp2_in_collective_parties_ends_together(geomx_job, tmp_path):
    """ESync (K1 = 2, K2 = 1) over two collective parties whose model FSDP2 shards, dc1 8x slower: each rank syncs
    the slices it owns from its shards (HFA's sharded rounds) and the control slice as well; dc0 trains all 8
    steps, dc1 fewer, and every rank ends with the same whole model (gathered by the script)."""
    path = write_topology(tmp_path / "job.yaml", lan=COLLECTIVE, hfa={"k1": 2, "k2": 1}, training={"esync": True},
                          slice_elems=384)
    job = geomx_job("fsdp_train.py", "--steps", "8", "--fsdp", "--step-s", "0.1", "--slow-rank", "2",
                    "--slowdown", "8", topology=path)  # the gap esync_job_with_a_slow_party explains
    job.assert_ok()
    workers = job.workers()
    assert sorted(workers) == [0, 1, 2, 3] and all(report["fsdp"] for _, report in workers.values())
    trained = {rank: report["trained_steps"] for rank, (_, report) in workers.items()}
    assert trained[0] == trained[1] == 8 and trained[2] == trained[3] < 8, trained
    jobkit.assert_one_trained_model(workers, "ESYNC")
