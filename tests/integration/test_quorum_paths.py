"""Decoupled outer rounds (``training.quorum``) on the paths around them: a WAN codec, and a late party whose last
deltas arrive after the others have left.

- int8 with every party on time is the synchronous int8 job within float rounding (the merge weighs decoded
  deltas; the synchronous job weighs them before the codec); int8 and a residual codec (sparse2bit) with a slow
  party folded in or dropped end with finite models, the late deltas counted, and a party's workers on one model;
- a slow party whose only global round comes after the fast one has finished: its deltas are folded into a round
  that no on-time party will close; the global server closes it when the last party leaves (its model moves by
  them), and the job ends at once. Before, that round stayed open: the deltas counted as folded in and never
  applied.
"""

from __future__ import annotations

import json

import pytest
import torch
from test_hfa import K1, K2, PARTIES, final_weights, outer_rounds

TIMEOUTS = {"request": "20s", "round": "20s", "shutdown": "5s"}
INT8 = {"type": "int8", "block": 256}
SPARSE2BIT = {"type": "sparse2bit", "density": 0.02, "chunk": 4096, "pull_density": 0.04}


def assert_every_fold_applied(report: dict) -> None:
    """Every delta counted as folded in late is in the ``folded`` list of a round the server closed (the job has
    fewer rounds than the report's history keeps)."""
    assert report["rounds"] <= 32, report["rounds"]
    folded: dict[str, int] = {}
    for entry in report["last_rounds"]:
        for name in entry["folded"]:
            folded[name] = folded.get(name, 0) + 1
    assert folded == report["late_folded"], (folded, report["late_folded"])


def test_int8_with_every_party_on_time_equals_the_synchronous_int8_job(geomx_job):
    """quorum = every party: the deltas go up int8-encoded, unweighted, with their tokens; the global server decodes
    them and weighs them by their share (each party's share of the workers), and answers with the int8 model. The
    synchronous job weighs each delta before the codec, so the two round differently: 1.5e-8 apart on weights of
    0.17 here, far below int8's step (their blocks' largest value / 127, about 1e-3): the same quantization."""
    args = ("hfa_train.py", "--steps", "12", "--outer", "outer_nesterov", "--compression", json.dumps(INT8))
    options = {"parties": PARTIES, "hfa": {"k1": K1, "k2": K2}, "timeouts": TIMEOUTS}
    today = final_weights(geomx_job(*args, name="today", **options))
    job = geomx_job(*args, name="decoupled", training={"quorum": 2, "grace": "auto"}, **options)
    decoupled = final_weights(job)
    assert sorted(decoupled) == sorted(today) == [0, 1, 2]
    for rank, tensors in today.items():
        for name in ("final", "job_model"):
            for index, (got, want) in enumerate(zip(decoupled[rank][name], tensors[name], strict=True)):
                torch.testing.assert_close(got, want, rtol=0, atol=1e-6, msg=f"worker {rank} {name} tensor {index}")
                assert torch.equal(got, decoupled[0][name][index]), f"worker {rank} {name} tensor {index}"
    report = outer_rounds(job)
    assert report["rounds"] > 0 and report["closed_by_grace"] == 0 and report["missed"] == {}


@pytest.mark.parametrize(("codec", "stale_rounds"), [(INT8, 10), (SPARSE2BIT, 10), (SPARSE2BIT, 0)],
                         ids=["int8_folded", "sparse2bit_folded", "sparse2bit_dropped"])
def test_a_slow_party_under_a_codec_is_folded_in_or_dropped_and_the_job_ends(geomx_job, codec, stale_rounds):
    """quorum 1 of 2, grace 0: dc1 sleeps 0.2 s a step, dc0 closes the rounds; dc1's deltas, a round or more late,
    are decoded and folded in (stale_rounds 10: none dropped) or dropped (stale_rounds 0: none folded in; what
    sparse2bit had sent of them is lost, its residual keeps only what it held back). Every model is finite; dc0's
    two workers hold the same job model (one party, the same answers)."""
    job = geomx_job("hfa_train.py", "--steps", "12", "--outer", "outer_nesterov", "--compression", json.dumps(codec),
                    "--sleep", json.dumps({"dc1": 0.2}), parties=PARTIES, hfa={"k1": K1, "k2": K2},
                    training={"quorum": 1, "grace": 0, "stale_rounds": stale_rounds}, timeouts=TIMEOUTS)
    workers = final_weights(job)
    assert sorted(workers) == [0, 1, 2]
    for rank, tensors in workers.items():
        for name in ("final", "job_model"):
            assert all(torch.isfinite(t).all() for t in tensors[name]), f"worker {rank} {name}"
    for got, want in zip(workers[0]["job_model"], workers[1]["job_model"], strict=True):
        assert torch.equal(got, want)
    report = outer_rounds(job)
    [slow] = [name for name in report["missed"] if "dc1" in name]
    if stale_rounds:
        assert report["late_folded"].get(slow, 0) > 0 and report["dropped"] == {}, report
    else:
        assert report["dropped"].get(slow, 0) > 0 and report["late_folded"] == {}, report
    assert_every_fold_applied(report)


def test_a_late_partys_last_deltas_after_the_others_left_are_applied(geomx_job):
    """quorum 1 of 2: dc1 (one global round, K1 x K2 steps) starts only once dc0's workers have ended their loops
    and pulled their job model (two global rounds). Its deltas, two rounds late, are folded into round 2, which
    dc0 never joins; the global server closes it once dc1 has left (the last party), so the fold is applied
    and the job ends promptly, well inside its round timeout."""
    job = geomx_job("hfa_train.py", "--steps", str(2 * K1 * K2), "--outer", "outer_nesterov",
                    "--party-steps", json.dumps({"dc1": K1 * K2}), "--after", json.dumps({"dc1": [0, 1]}),
                    parties=PARTIES, hfa={"k1": K1, "k2": K2}, timeouts=TIMEOUTS,
                    training={"quorum": 1, "grace": 0, "stale_rounds": 5})
    job.assert_ok()
    assert job.result.wall_s < 20, f"the job waited for a timeout: {job.result.wall_s:.1f} s"
    report = outer_rounds(job)
    [slow] = [name for name in report["late_folded"] if "dc1" in name]
    slices = report["on_time"][next(name for name in report["on_time"] if "dc0" in name)] // 2
    assert report["late_folded"][slow] == slices and report["dropped"] == {}, report
    assert_every_fold_applied(report)
    last = [entry for entry in report["last_rounds"] if entry["round"] == 2]
    assert len(last) == slices and all(e["quorum"] == [] and e["folded"] == [slow] for e in last), last
