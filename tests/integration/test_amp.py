"""Mixed precision with ``torch.amp.GradScaler`` (the forward under ``torch.autocast`` in float16, the loss scaled)
under the wrapper: the script calls ``opt.average_gradients()`` before ``scaler.step(opt)``, so the scaler checks
and unscales the gradients the step applies (``geomx.torch.amp``). A step whose gradients are not finite anywhere
(one rank's loss made infinite) is skipped by every worker that averages them, their scales stay equal, and the
algorithm's schedule goes on."""

from __future__ import annotations

import jobkit
import numpy as np
import torch
from harness import write_topology

SCRIPT = "frontend_train.py"
STEPS, INF_RANK, INF_STEP = 6, 3, 2
AMP = ("--amp", "--inf-rank", str(INF_RANK), "--inf-step", str(INF_STEP), "--momentum", "0")


def test_fsa_under_a_grad_scaler_replays_and_every_worker_skips_the_infinite_step(geomx_job, tmp_path):
    """FSA with SGD on every rank, a collective party beside a server party: each step's weights are the held ones
    minus lr x (the four ranks' scaled gradients summed as the tiers sum them, / 4, / the scale), bit for bit, on
    every rank; at the step where rank 3's loss is infinite every rank keeps its weights, and every scaler halves
    its scale there (1024 -> 512), the same on all. Without the wrapper's part the scalers that see only their own
    gradients step and keep their scale; with ``step()`` skipped the next backward fails."""
    path = write_topology(tmp_path / "job.yaml", lan={"dc0": "collective", "dc1": "server"}, slice_elems=512,
                          training={"server_optimizer": "none"})
    job = geomx_job(SCRIPT, *AMP, "--record", "--steps", str(STEPS), topology=path)
    job.assert_ok()
    workers = job.workers()
    assert sorted(workers) == [0, 1, 2, 3]
    want_scales = [1024.0] * (INF_STEP + 1) + [512.0] * (STEPS - INF_STEP - 1)
    assert all(report["scales"] == want_scales for _, report in workers.values()), \
        {rank: report["scales"] for rank, (_, report) in workers.items()}
    keys = len(workers[0][0]["final"])
    for step in range(STEPS):
        for key in range(keys):
            at = step * keys + key
            held = workers[0][0]["held"][at]
            local = [workers[r][0]["local"][at] for r in range(4)]
            total = (local[0] + local[1]) + (local[2] + local[3])  # each party's float32 sum, then the parties'
            grad = (total * 0.25) * np.float32(1 / want_scales[step])  # the mean, unscaled (powers of two: exact)
            if torch.isfinite(grad).all():
                param = torch.nn.Parameter(held.clone())
                param.grad = grad
                torch.optim.SGD([param], lr=jobkit.LR).step()
                expected = param.detach()
            else:
                assert step == INF_STEP, f"step {step} key {key} is not finite"
                expected = held
            for rank, (tensors, _) in workers.items():
                after = tensors["held"][at + keys] if step + 1 < STEPS else tensors["final"][key]
                assert torch.equal(after, expected), f"rank {rank} after step {step}, key {key}"


def test_hfa_under_a_grad_scaler_skips_in_the_party_that_met_the_infinite_step(geomx_job, tmp_path):
    """HFA (K1 = 2, K2 = 2) over two collective parties: the party whose rank's loss is infinite at step 2 skips
    that update on both its ranks and halves both scales; the other party's scales stay; the local and global
    rounds stay on their steps (the job ends, every party on one model after the last global round)."""
    path = write_topology(tmp_path / "job.yaml", lan={"dc0": "collective", "dc1": "collective"}, slice_elems=512,
                          hfa={"k1": 2, "k2": 2}, training={"server_optimizer": "outer_nesterov"})
    job = geomx_job(SCRIPT, *AMP, "--record", "--steps", "8", topology=path)
    job.assert_ok()
    workers = job.workers()
    scales = {rank: report["scales"] for rank, (_, report) in workers.items()}
    assert scales[0] == scales[1] == [1024.0] * 8, scales
    assert scales[2] == scales[3] == [1024.0] * (INF_STEP + 1) + [512.0] * (8 - INF_STEP - 1), scales
    keys = len(workers[0][0]["final"])
    for rank in (2, 3):  # the skipped update: the weights after step 2 (not a round's step) are those before it
        tensors = workers[rank][0]
        for key in range(keys):
            at = INF_STEP * keys + key
            assert torch.equal(tensors["held"][at + keys], tensors["held"][at]), (rank, key)
    for rank in range(1, 4):  # step 8 closed a global round: every rank holds the global model
        assert all(torch.equal(a, b) for a, b in zip(workers[rank][0]["final"], workers[0][0]["final"], strict=True))
