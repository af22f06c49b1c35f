"""HiPS sends each party's aggregate over the WAN once; a flat PS sends every worker's tensors over it.

The same 2 parties x 2 workers job (no link emulation, fixed steps) runs under both modes. Only dc1 is
across the WAN from the central party dc0, so the WAN carries dc1's local server's traffic under HiPS and
both dc1 workers' traffic under a flat PS: flat / hips == workers per party (2), up to protocol overhead.
"""

from __future__ import annotations

import jobkit
import pytest

WORKERS_PER_PARTY = 2


def _payload_bytes() -> int:
    """Tensor bytes one client of the global tier moves over the WAN: INIT value down, then per step a
    gradient up and the new weights down."""
    return (2 * jobkit.STEPS + 1) * jobkit.param_bytes()


def test_hips_wan_bytes_are_one_aggregate_per_party(standard_hips_job):
    job = standard_hips_job
    job.assert_ok()
    wan = job.summary["wan_bytes"]
    assert _payload_bytes() <= wan <= 1.10 * _payload_bytes(), (wan, _payload_bytes())
    # every byte over the WAN is sent by dc1/server up or by the global server (in dc0) down
    by_party = job.summary["wan_bytes_sent_by_party"]
    assert by_party["dc1"] >= jobkit.STEPS * jobkit.param_bytes()
    assert by_party["dc0"] >= (jobkit.STEPS + 1) * jobkit.param_bytes()
    # workers, local servers, global server, and the schedulers (registration and heartbeats cross the WAN too)
    assert job.summary["processes_reporting"] == 4 + 2 + 1 + 2 + 1


def test_flat_over_hips_wan_bytes_is_workers_per_party(standard_hips_job, standard_flat_job):
    standard_hips_job.assert_ok()
    standard_flat_job.assert_ok()
    # a flat PS computes the same thing, only with more WAN traffic
    jobkit.assert_fsa_equivalent(standard_flat_job.workers(), num_workers=4)
    hips = standard_hips_job.summary["wan_bytes"]
    flat = standard_flat_job.summary["wan_bytes"]
    assert flat / hips == pytest.approx(WORKERS_PER_PARTY, rel=0.10), (flat, hips)


@pytest.mark.parametrize("mode", ["hips", "flat"])
def test_worker_wan_bytes_agree_with_launcher_summary(mode, standard_hips_job, standard_flat_job):
    job = standard_hips_job if mode == "hips" else standard_flat_job
    job.assert_ok()
    report = job.workers()[0][1]  # the master asked kv.wan_bytes() after the final barrier
    summary = job.summary["wan_bytes"]
    assert report["wan_bytes"] == pytest.approx(summary, rel=0.10), (report["wan_bytes"], summary)
    # what the worker saw was before the shutdown round, so it cannot exceed the final total
    assert report["wan_bytes"] <= summary
    # kv.stats() names the global tier's servers and their WAN counters
    servers = report["stats"]["servers"]
    tiers = next(iter(servers.values())).get("upstream", servers) if mode == "hips" else servers
    assert sorted(tiers) == ["global_server0"]
    assert tiers["global_server0"]["wan"]["recv"] >= jobkit.STEPS * jobkit.param_bytes()
