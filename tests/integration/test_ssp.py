"""Bounded staleness (dist_ssp) across real processes: two parties, HiPS, the global server's record of answers.

- ``staleness: 0`` is FSA: the same job under dist_sync and dist_ssp ends with bit-identical weights;
- a party 3x slower than the other: the fast one runs ahead (the global server answered it early) but never
  more than ``staleness`` rounds beyond the last completed round, and every push is still applied once;
- the digits CNN learns through the ``geomx.torch`` wrapper with ``sync: dist_ssp`` in the topology.
"""

from __future__ import annotations

import json

import jobkit
import pytest
import torch
from harness import EXAMPLES_DIR

from geomx.runs.runlog import read_metrics


def _global_leads(job) -> dict[str, dict[int, int]]:
    """The global server's record: per local server, how many answers let it run how many rounds ahead."""
    stats = json.loads((job.run_dir / "stats" / "global_server0.json").read_text())
    return {name: {int(lead): count for lead, count in leads.items()} for name, leads in stats["answer_leads"].items()}


def test_staleness_zero_gives_exactly_fsas_weights(geomx_job, standard_hips_job):
    job = geomx_job("train.py", "--kind", "dist_ssp", training={"staleness": 0}, name="ssp0")
    job.assert_ok()
    standard_hips_job.assert_ok()
    fsa, ssp = standard_hips_job.workers(), job.workers()
    assert sorted(ssp) == sorted(fsa) == [0, 1, 2, 3]
    for rank in fsa:
        for got, want in zip(ssp[rank][0]["final"], fsa[rank][0]["final"], strict=True):
            assert torch.equal(got, want), f"worker {rank}: dist_ssp with staleness 0 differs from FSA"
    leads = _global_leads(job)
    assert sorted(leads) == ["dc0/server", "dc1/server"] and all(set(n) == {0} for n in leads.values()), leads


STEPS = 12
BASE_DELAY_S = 0.1  # every party's step
SLOWDOWN = 3  # dc1's step takes 3x as long


@pytest.mark.parametrize("staleness", [2])
def test_a_3x_slower_party_is_never_more_than_s_rounds_behind(geomx_job, staleness):
    job = geomx_job("mixed_sync.py", "--kind", "dist_ssp", "--steps", str(STEPS), "--base-delay", str(BASE_DELAY_S),
                    "--delay", str(SLOWDOWN * BASE_DELAY_S), training={"staleness": staleness})
    job.assert_ok()
    leads = _global_leads(job)
    assert sorted(leads) == ["dc0/server", "dc1/server"], leads
    for name, counts in leads.items():  # the bound: no answer let a party run more than s rounds ahead
        assert max(counts) <= staleness, (name, counts)
    # the fast party WAS ahead (answered before its round completed), up to the bound; the slow one never
    assert max(leads["dc0/server"]) == staleness, leads
    assert set(leads["dc1/server"]) == {0}, leads
    # every push applied exactly once, as FSA sums them (plain SGD: w0 - lr * sum of all pushes / workers)
    workers = jobkit.load_worker_outputs(job.run_dir)
    jobkit.assert_every_push_applied_once(workers)


@pytest.mark.slow
def test_the_wrapper_learns_digits_under_ssp(geomx_job):
    # one worker per party at batch 64: the global batch and the steps of two workers per party at 32, half the CPU
    job = geomx_job(EXAMPLES_DIR / "cnn_torch.py", "--epochs", "8", "--batch-size", "64",
                    training={"sync": "dist_ssp", "staleness": 2}, name="ssp-digits", parties={"dc0": 1, "dc1": 1})
    job.assert_ok()
    assert "synchronization: dist_ssp" in job.output  # the wrapper had the master name it on the servers
    accuracy = [r["accuracy"] for r in read_metrics(job.run_dir)["dc0_worker0"] if "accuracy" in r]
    assert len(accuracy) == 8, accuracy
    # 0.922 after 8 epochs seen on 2026-11-24 (2 x 2 workers, 2 cores, load average 7-8; 1 x 2 at batch 64:
    # 0.947 at load 13), minus a margin for the order in which the parties' answers come (asynchronous within
    # the bound)
    assert accuracy[-1] >= 0.88, accuracy
    assert all(max(int(lead) for lead in n) <= 2 for n in _global_leads(job).values())
