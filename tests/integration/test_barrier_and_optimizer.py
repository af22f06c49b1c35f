"""kv.barrier waits for every worker of every party; servers sum; only the master may set the optimizer."""

from __future__ import annotations

import json

import jobkit

SLOW_RANKS = [3, 1]  # dc1/worker1 (the other party), then dc0/worker1 (the master's own party)
DELAY_S = 1.5


def test_barrier_sum_and_master_only_optimizer(geomx_job):
    job = geomx_job("barrier_sum.py", "--slow-ranks", *map(str, SLOW_RANKS), "--delay", str(DELAY_S),
                    slice_elems=64)
    job.assert_ok()
    reports = {}
    for path in sorted((job.run_dir / jobkit.OUT_DIR).glob("barrier*.json")):
        report = json.loads(path.read_text())
        reports[report["global_rank"]] = report
    assert sorted(reports) == [0, 1, 2, 3]

    # set_optimizer is the master's alone
    for rank, report in reports.items():
        if rank == 0:
            assert "set_optimizer" not in report
        else:
            assert report["set_optimizer"]["outcome"] == "RuntimeError", report
            assert "master worker" in report["set_optimizer"]["text"]

    # without an optimizer the servers sum: (1 + 2 + 3 + 4) * 10**round, in every party; init is the master's
    for rank, report in reports.items():
        assert report["init"] == [[100.0, 100.0, 100.0], -1.0], rank
        assert report["sums"][0]["key0"] == [10.0, 10.0, 10.0], rank
        assert report["sums"][1]["key0"] == [100.0, 100.0, 100.0], rank
        assert all(s["key1_equal"] for s in report["sums"]), rank  # a 200-element key in 4 slices
        assert report["pulled"] == [100.0, 100.0, 100.0], rank

    # nobody leaves a barrier before the slow worker has entered it
    for index, slow in enumerate(SLOW_RANKS):
        slow_entered = reports[slow]["barriers"][index]["entered"]
        assert reports[slow]["barriers"][index]["slow"] == slow
        for rank, report in reports.items():
            left = report["barriers"][index]["left"]
            assert left >= slow_entered, (index, rank, left, slow_entered)
        # and the fast workers really did wait (they entered well before the slow one)
        fast_entered = [r["barriers"][index]["entered"] for k, r in reports.items() if k != slow]
        assert slow_entered - min(fast_entered) > DELAY_S / 2
