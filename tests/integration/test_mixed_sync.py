"""MixedSync (dist_async): the global tier applies each party's push on arrival; a slow party blocks nobody."""

from __future__ import annotations

import json

import jobkit
import pytest
import torch

from geomx.algorithms.tsengine.rules import read_reports

STEPS = 8
DELAY_S = 0.25


def _outputs(job):
    workers = jobkit.load_worker_outputs(job.run_dir)
    assert sorted(workers) == [0, 1, 2, 3], sorted(workers)
    return workers


def assert_the_slowed_party_blocks_only_under_fsa(workers, fsa: bool) -> None:
    """dc1 was slowed by DELAY_S a step; under FSA dc0 waited for it, otherwise dc0 ended in well under its time."""
    fast = max(report["train_s"] for tensors, report in workers.values() if report["party"] == "dc0")
    slow = min(report["train_s"] for tensors, report in workers.values() if report["party"] == "dc1")
    assert slow >= STEPS * DELAY_S
    if fsa:
        assert fast >= 0.8 * slow, f"under FSA dc0 ({fast:.2f} s) must wait for dc1 ({slow:.2f} s)"
    else:
        assert fast < 0.5 * slow, f"dc0 took {fast:.2f} s, the slowed dc1 {slow:.2f} s: dc0 was held back"


# plain MixedSync's run is the next test's (its fast party leaves early, so there only the slow ranks' weights)
@pytest.mark.parametrize(("kind", "tsengine"), [("dist_sync", None), ("dist_async", {"inter": False, "intra": True})],
                         ids=["fsa", "mixed_sync_intra_tsengine"])
def test_every_push_applied_once_and_the_slow_party_blocks_only_under_fsa(geomx_job, kind, tsengine):
    job = geomx_job("mixed_sync.py", "--steps", str(STEPS), "--delay", str(DELAY_S), "--kind", kind,
                    tsengine=tsengine)
    job.assert_ok()
    workers = _outputs(job)
    if tsengine is not None:  # dc0's local server coordinated its workers' rounds
        assert read_reports(job.run_dir)["dc0_server"]["rounds"] > 0
    jobkit.assert_every_push_applied_once(workers)
    assert_the_slowed_party_blocks_only_under_fsa(workers, fsa=kind == "dist_sync")


def test_a_fast_party_leaves_while_the_slow_party_still_trains(geomx_job):
    # The slow party keeps going until every fast worker's close() has returned, so with shutdown as a round
    # over all parties (the old behaviour) the fast workers would time out in close() after 3 s.
    job = geomx_job("mixed_sync.py", "--steps", str(STEPS), "--delay", str(DELAY_S), "--leave-early",
                    timeouts={"shutdown": "3s"})
    job.assert_ok()
    workers = _outputs(job)
    assert_the_slowed_party_blocks_only_under_fsa(workers, fsa=False)
    initial = workers[0][0]["initial"]
    # the global server counted every party's pushes by staleness: the slowed party's first one came after some
    # of the fast party's were applied (dc1 sleeps before each step)
    stats = json.loads((job.run_dir / "stats" / "global_server0.json").read_text())
    stale = {name: {int(k): n for k, n in counts.items()} for name, counts in stats["push_staleness"].items()}
    assert sorted(stale) == ["dc0/server", "dc1/server"], stale
    assert all(sum(counts.values()) == STEPS * len(initial) for counts in stale.values()), stale
    assert max(stale["dc1/server"]) > 0, stale
    total_pushed = [sum(workers[r][0]["pushed"][i] for r in workers) for i in range(len(initial))]
    expected = [w0 - jobkit.LR * g for w0, g in zip(initial, total_pushed, strict=True)]
    slow = {rank: tensors for rank, (tensors, report) in workers.items() if report["party"] == "dc1"}
    assert sorted(slow) == [2, 3]
    for rank, tensors in slow.items():
        for got, want in zip(tensors["final"], expected, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=f"worker {rank}")
