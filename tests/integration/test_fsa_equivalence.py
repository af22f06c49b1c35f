"""FSA over HiPS is one big synchronous SGD: 4 workers x N steps == one process on the union of batches.

The global server runs SGD(lr, momentum=0.9) on the sum of the 4 gradients scaled by 1/num_all_workers,
so after every step each worker must hold exactly what torch.optim.SGD computes in one process on the
union of the 4 batches (mean loss over the union), starting from the master worker's initial weights.
"""

from __future__ import annotations

import jobkit
import pytest
import torch
from compressed_train import reference_sgd
from harness import run_job

from geomx.config import WAN_SLICE_ELEMS
from geomx.core.sharding import slice_plan
from geomx.transport.trace import read_trace


def test_fsa_matches_single_process_sgd(standard_hips_job):
    job = standard_hips_job
    job.assert_ok()
    jobkit.assert_fsa_equivalent(job.workers(), num_workers=4)
    names = {report["name"] for _, report in job.workers().values()}
    assert names == {"dc0/worker0", "dc0/worker1", "dc1/worker0", "dc1/worker1"}
    masters = [rank for rank, (_, report) in job.workers().items() if report["is_master_worker"]]
    assert masters == [0]


@pytest.mark.parametrize(("slice_elems", "global_servers"), [(64, 2)], ids=["64-elem-slices-2-global-servers"])
def test_fsa_with_slices_and_two_global_servers(geomx_job, slice_elems, global_servers):
    # Linear(32, 64) has 2048 weights: 32 slices spread over both global servers (see sharding.ShardPlanner).
    assert 10 * slice_elems < jobkit.IN_FEATURES * jobkit.HIDDEN
    job = geomx_job("train.py", slice_elems=slice_elems, global_servers=global_servers)
    job.assert_ok()
    jobkit.assert_fsa_equivalent(job.workers(), num_workers=4)
    # both global servers really served slices: each received tensor bytes from the local servers
    stats = job.workers()[0][1]["stats"]["servers"]["dc0/server"]["upstream"]
    assert sorted(stats) == ["global_server0", "global_server1"]
    for name, body in stats.items():
        received = body["lan"]["recv"] + body["wan"]["recv"]
        assert received > jobkit.STEPS * jobkit.param_bytes() / 2 * 0.8, (name, body)


LARGE_HIDDEN, LARGE_STEPS, LARGE_LR = 16384, 3, 0.01  # a smaller lr than jobkit's: this wide layer diverges at 0.1


@pytest.fixture(scope="module")
def large_tensor_job(tmp_path_factory: pytest.TempPathFactory):
    """compressed_train.py, dense, with a 32 x 16384 first layer and the default slices, traced (GEOMX_TRACE): one
    job for the default-slices test and the early-answers test."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GEOMX_TRACE", "1")
        return run_job(tmp_path_factory.mktemp("large-tensor"), "compressed_train.py", "--steps", str(LARGE_STEPS),
                       "--hidden", str(LARGE_HIDDEN), "--compression", "null", "--lr", str(LARGE_LR),
                       name="default-slices")


def test_default_slices_of_a_large_tensor_match_single_process_sgd(large_tensor_job):
    """Two parties' default slice_elems cuts a 32 x 16384 weight (524,288 elements) into slices that travel and
    are summed independently (pushes and answers overlap on a full-duplex link): still one process's SGD."""
    assert jobkit.IN_FEATURES * LARGE_HIDDEN >= 2 * WAN_SLICE_ELEMS  # two parties: at least two slices
    job = large_tensor_job
    job.assert_ok()
    workers = jobkit.load_worker_outputs(job.run_dir)
    assert sorted(workers) == [0, 1, 2, 3]
    expected = reference_sgd(workers[0][0]["initial"], LARGE_STEPS, LARGE_HIDDEN, LARGE_LR)
    for tensors, _ in workers.values():
        for got, want in zip(tensors["final"], expected, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_dcasgd_with_a_single_party_is_momentum_sgd(geomx_job):
    """One party under MixedSync has no staleness: DCASGD's compensation vanishes and it is momentum SGD."""
    job = geomx_job("train.py", "--kind", "dist_async", "--dcasgd", parties={"dc0": 2})
    job.assert_ok()
    jobkit.assert_fsa_equivalent(job.workers(), num_workers=2)


def test_early_answers_keep_fsa_exact(large_tensor_job):
    """Servers that only sum send the last party of each slice the other party's sum before its push arrives
    (geomx.core.early): its local server adds its own sum. Both parties still hold bit-identical models, and
    those are one process's SGD. The trace shows the early answers: the global server's only non-reply pushes.
    (The default-slices test's job, traced: its first layer travels as two slices.)"""
    job = large_tensor_job
    job.assert_ok()
    early = [e for e in read_trace([job.run_dir]) if e["node"].startswith("global_server")
             and e["event"] == "queue" and e["kind"] == "PUSHPULL" and not e["reply"]]
    workers = jobkit.load_worker_outputs(job.run_dir)
    slices = sum(len(slice_plan(t.numel(), WAN_SLICE_ELEMS)) for t in workers[0][0]["initial"])  # 2 + 3
    assert slices == 5, slices
    assert len(early) >= LARGE_STEPS * slices, len(early)  # one per slice and step
    assert {e["peer"].split("/")[0] for e in early} <= {"dc0", "dc1"}
    finals = [tensors["final"] for tensors, _ in workers.values()]
    for other in finals[1:]:  # every worker of both parties: the very same bits
        for got, want in zip(other, finals[0], strict=True):
            assert torch.equal(got, want)
    expected = reference_sgd(workers[0][0]["initial"], LARGE_STEPS, LARGE_HIDDEN, LARGE_LR)
    for got, want in zip(finals[0], expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
