"""Collective parties with the model on a GPU: NCCL inside each party, only each rank's owned slices on the host
(FSA: one pinned chunk per bucket, ``geomx.collective.host``; HFA: the round machine's CUDA mirror,
``geomx.collective.mirror``). The same references as the CPU tests
(``test_collective``); skipped without CUDA. Two ranks of a party share one GPU here, as on a test machine."""

from __future__ import annotations

import jobkit
import pytest
import torch
from test_bf16 import run_and_replay
from test_collective import (
    K1,
    SCRIPT,
    SLICE_ELEMS,
    bisparse_hfa_job,
    fsdp_fsa_job,
    fsdp_matches_the_job_without_it,
    simulate_collective_hfa,
    topology,
)
from test_collective_algorithms import esync_job_with_a_slow_party

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("ddp", [False, True], ids=["plain-model", "the-scripts-ddp-over-nccl"])
def test_fsa_in_collective_parties_on_cuda_equals_single_process_sgd(geomx_job, tmp_path, ddp):
    """2 parties x 2 ranks over NCCL, a bucket per tensor: every rank ends with the single-process reference's
    weights (to float tolerance: the GPU sums in its own order), bit for bit the same on every rank. With the
    script's own DDP (its group initialized by the script, NCCL only) DDP communicates nothing."""
    path = topology(tmp_path, {"dc0": "collective", "dc1": "collective"},
                    {"server_optimizer": "auto", "bucket_mb": 0.001}, slice_elems=SLICE_ELEMS)
    job = geomx_job(SCRIPT, "--device", "cuda", *(["--ddp"] if ddp else []), topology=path)
    job.assert_ok()
    workers = job.workers()
    assert {report["device"].split(":")[0] for _, report in workers.values()} == {"cuda"}
    assert {report["ddp_comm_hook"] for _, report in workers.values()} == {"gradients_stay_local" if ddp else None}
    jobkit.assert_fsa_equivalent(workers, num_workers=4)


def test_fsa_of_a_bfloat16_model_on_cuda_replays_bit_for_bit(geomx_job, tmp_path):
    """A bfloat16 model on the GPU, a collective party (NCCL, its reduce-scatter in bfloat16) beside a server
    party: each step replays from the ranks' gradients as on the CPU (``test_bf16``); only the owned slices,
    widened to float32, cross to the host."""
    run_and_replay(geomx_job, tmp_path, {"dc0": "collective", "dc1": "server"}, None, False, "--device", "cuda")


def test_hfa_outer_nesterov_in_collective_parties_on_cuda_matches_the_simulation(geomx_job, tmp_path):
    """HFA with DiLoCo's outer Nesterov: two collective parties on the GPU and a server party of one beside them."""
    parties = {"dc0": 2, "dc1": 2, "dc2": 1}
    path = topology(tmp_path, {"dc0": "collective", "dc1": "collective"}, {"server_optimizer": "outer_nesterov"},
                    parties=parties, hfa={"k1": K1, "k2": 2}, slice_elems=SLICE_ELEMS)
    job = geomx_job(SCRIPT, "--device", "cuda", "--steps", "12", "--momentum", "0", topology=path)
    job.assert_ok()
    workers = job.workers()
    assert sorted(workers) == list(range(5)), "every worker reports"
    expected, _ = simulate_collective_hfa(workers[0][0]["after_init"], parties, "outer_nesterov", 2, 12)
    party_of = [party for party, count in parties.items() for _ in range(count)]
    for rank, (tensors, report) in workers.items():
        assert report["device"].startswith("cuda") and report["mode"] == "HFA"
        for got, want in zip(tensors["final"], expected[party_of[rank]], strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=f"worker {rank}")


def test_streaming_hfa_in_collective_parties_on_cuda_matches_the_simulation(geomx_job, tmp_path):
    """Streaming DiLoCo on the GPU (2 fragments of K2 = 4, each round overlapping the next local round, alpha 0.25):
    the leaving slices go down on the mirror's side stream while the ranks train on, the trip's copy up and share
    run on it too; every rank ends with the simulation's weights."""
    parties = {"dc0": 2, "dc1": 2, "dc2": 1}
    streaming = {"fragments": 2, "fragment_delay": 1, "fragment_alpha": 0.25}
    path = topology(tmp_path, {"dc0": "collective", "dc1": "collective"},
                    {"server_optimizer": "outer_nesterov", **streaming}, parties=parties, hfa={"k1": K1, "k2": 4},
                    slice_elems=SLICE_ELEMS)
    job = geomx_job(SCRIPT, "--device", "cuda", "--steps", "14", "--momentum", "0", topology=path)
    job.assert_ok()
    workers = job.workers()
    expected, _ = simulate_collective_hfa(workers[0][0]["after_init"], parties, "outer_nesterov", 4, 14, fragments=2,
                                          delay=1, alpha=0.25)
    party_of = [party for party, count in parties.items() for _ in range(count)]
    for rank, (tensors, report) in workers.items():
        assert report["mode"] == "HFA"
        for got, want in zip(tensors["final"], expected[party_of[rank]], strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=f"worker {rank}")


def test_bisparse_under_hfa_in_collective_parties_on_cuda(geomx_job, tmp_path):
    """Bi-Sparse under HFA with the model on the GPU: the compressed model changes are added on the host chunk."""
    bisparse_hfa_job(geomx_job, tmp_path, "--device", "cuda")


def test_esync_with_a_collective_party_on_cuda_beside_a_server_party(geomx_job, tmp_path):
    """ESync with the collective party's model on the GPU (its control flag and step count stay on the host)."""
    workers = esync_job_with_a_slow_party(geomx_job, tmp_path, "--device", "cuda")
    assert {report["device"].split(":")[0] for _, report in workers.values()} == {"cuda"}


@pytest.mark.parametrize(("server_optimizer", "mode"), [("auto", "LOCAL"), ("translate", "SERVER")],
                         ids=["sgd-on-every-rank", "sgd-on-the-servers"])
def test_fsa_with_fsdp2_on_cuda_equals_single_process_sgd(geomx_job, tmp_path, server_optimizer, mode):
    """FSDP2 over NCCL in two collective parties (its mesh on the GPU, ``fully_shard`` per layer and on the root):
    each rank's owned slices go from its CUDA shards to the host and the answers back into them; every rank holds
    single-process SGD's weights (to float tolerance: the GPU sums in its own order)."""
    fsdp_fsa_job(geomx_job, tmp_path, server_optimizer, mode, "--device", "cuda", rtol=1e-4, atol=1e-5)


def test_fsdp2_on_cuda_under_streaming_diloco_trains_as_the_same_job_without_it(geomx_job, tmp_path):
    """Streaming DiLoCo over two collective parties on the GPU, the model sharded by FSDP2 over NCCL or not: the
    same weights, job model and WAN bytes (``test_collective``'s FSDP2 test, on CUDA)."""
    fsdp_matches_the_job_without_it(geomx_job, tmp_path, "float32", "--device", "cuda")
