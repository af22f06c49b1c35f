"""Uneven loops inside a collective party (``with opt.join():``, ``geomx.torch.join``): a rank whose data ends first
takes zero-gradient steps beside the others, every rank ends on one model, and the job replays exactly."""

from __future__ import annotations

import jobkit
import torch
from harness import write_topology

SCRIPT = "frontend_train.py"
STEPS, SHORT_RANK, SHORT_STEPS = 5, 1, 3


def test_fsa_with_a_rank_whose_loop_ends_early_replays_with_its_gradient_as_zero(geomx_job, tmp_path):
    """FSA with SGD on every rank, a collective party (rank 1 runs 3 steps of 5) beside a server party: every step
    replays, bit for bit on every rank still training, as (the others' sum + zero for rank 1) / 4, and rank 1 ends
    on the model of the rest (its two shadow steps took the same update). Without join its party waits for it until
    the round timeout."""
    path = write_topology(tmp_path / "job.yaml", lan={"dc0": "collective", "dc1": "server"}, slice_elems=512,
                          training={"server_optimizer": "none"})
    job = geomx_job(SCRIPT, "--join", "--short-rank", str(SHORT_RANK), "--short-steps", str(SHORT_STEPS),
                    "--momentum", "0", "--record", "--steps", str(STEPS), topology=path)
    job.assert_ok()
    workers = job.workers()
    assert sorted(workers) == [0, 1, 2, 3]
    keys = len(workers[0][0]["final"])
    assert len(workers[SHORT_RANK][0]["held"]) == SHORT_STEPS * keys  # its loop: 3 steps
    for step in range(STEPS):
        for key in range(keys):
            at = step * keys + key
            held = workers[0][0]["held"][at]
            local = [workers[r][0]["local"][at] if step < len(workers[r][0]["held"]) // keys else torch.zeros_like(held)
                     for r in range(4)]
            param = torch.nn.Parameter(held.clone())
            param.grad = ((local[0] + local[1]) + (local[2] + local[3])) * (1.0 / 4)
            torch.optim.SGD([param], lr=jobkit.LR).step()
            for rank, (tensors, _) in workers.items():
                trained = len(tensors["held"]) // keys
                if step + 1 < trained:
                    after = tensors["held"][at + keys]
                elif step + 1 == STEPS:
                    after = tensors["final"][key]
                else:
                    continue  # a shadow step: checked by its final weights
                assert torch.equal(after, param.detach()), f"rank {rank} after step {step}, key {key}"


def test_streaming_hfa_with_a_rank_whose_loop_ends_early_ends_on_one_model_per_party(geomx_job, tmp_path):
    """Streaming HFA (K1 = 2, K2 = 2, two fragments, each round overlapping the next local round) over two collective
    parties, rank 1 running 5 steps of 8: the job ends (rank 1's shadow steps meet its party's collectives and the
    rounds), and each party's ranks end on one model."""
    path = write_topology(tmp_path / "job.yaml", lan={"dc0": "collective", "dc1": "collective"}, slice_elems=512,
                          hfa={"k1": 2, "k2": 2}, training={"server_optimizer": "outer_nesterov", "fragments": 2,
                                                            "fragment_delay": 1, "fragment_alpha": 0.5})
    job = geomx_job(SCRIPT, "--join", "--short-rank", str(SHORT_RANK), "--short-steps", "5", "--momentum", "0",
                    "--steps", "8", topology=path)
    job.assert_ok()
    workers = job.workers()
    for first, second in ((0, 1), (2, 3)):
        for a, b in zip(workers[first][0]["final"], workers[second][0]["final"], strict=True):
            assert torch.equal(a, b), (first, second)
    assert workers[SHORT_RANK][1]["trained_steps"] == 5 and workers[0][1]["trained_steps"] == 8
