"""ESync: the state server gives a slowed worker fewer local steps, so every worker reaches the aggregation together."""

from __future__ import annotations

import jobkit
import torch

BASE = 2
SLOW_RANK = 3


def test_slow_worker_gets_fewer_steps_and_everyone_ends_equal(geomx_job):
    job = geomx_job("esync_train.py", "--rounds", "4", "--slow-rank", str(SLOW_RANK), "--delay", "0.02",
                    hfa={"k1": BASE, "k2": 1})
    job.assert_ok()
    workers = jobkit.load_worker_outputs(job.run_dir)
    assert sorted(workers) == [0, 1, 2, 3]
    reports = {rank: report for rank, (_, report) in workers.items()}
    for rank, report in reports.items():
        if rank == SLOW_RANK:
            assert report["assigned"] == [BASE] * 4, report
        else:  # about 0.02 s per step slower: the others fit many more steps in the same time
            assert min(report["assigned"]) >= 3 * BASE, (rank, report)
            assert report["local_steps"] > 2 * reports[SLOW_RANK]["local_steps"], (rank, report)
    # once assignments apply (rounds 2..4) no worker's round takes more than twice another's
    for index in range(1, 4):
        times = [report["round_s"][index] for report in reports.values()]
        assert max(times) < 2 * min(times) + 0.05, (index, times)
    final = workers[0][0]["final"]
    for tensors, _ in workers.values():
        for got, want in zip(tensors["final"], final, strict=True):
            assert torch.equal(got, want)
