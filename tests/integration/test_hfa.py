"""HFA across real processes equals a single-process simulation of the algorithm (parties weighted by workers)."""

from __future__ import annotations

import jobkit
import pytest
import torch
import torch.nn.functional as F

from geomx.tsengine import read_reports

K1, K2, STEPS = 2, 3, 12
PARTIES = {"dc0": 2, "dc1": 1}  # unequal parties: the global average must weigh dc0 twice


def simulate(initial: list[torch.Tensor], outer: str) -> list[list[torch.Tensor]]:
    """Every worker's final weights under HFA, computed in one process."""
    ranks_of = {"dc0": [0, 1], "dc1": [2]}
    total = sum(PARTIES.values())
    workers = [[w.clone() for w in initial] for _ in range(total)]
    global_model = [w.clone() for w in initial]
    velocity = [torch.zeros_like(w) for w in initial]
    inputs, targets = jobkit.make_data(STEPS, total)
    model = jobkit.make_model()
    local_rounds = 0
    for step in range(1, STEPS + 1):
        for rank in range(total):
            with torch.no_grad():
                for p, w in zip(model.parameters(), workers[rank], strict=True):
                    p.copy_(w)
            model.zero_grad()
            F.mse_loss(model(inputs[step - 1, rank]), targets[step - 1, rank]).backward()
            workers[rank] = [w - jobkit.LR * p.grad for w, p in zip(workers[rank], model.parameters(), strict=True)]
        if step % K1:
            continue
        local_rounds += 1
        averages = {party: [sum(workers[r][i] / len(ranks) for r in ranks) for i in range(len(initial))]
                    for party, ranks in ranks_of.items()}
        if local_rounds % K2:
            for party, ranks in ranks_of.items():
                for r in ranks:
                    workers[r] = [a.clone() for a in averages[party]]
            continue
        delta = [sum((averages[p][i] - global_model[i]) * PARTIES[p] / total for p in PARTIES)
                 for i in range(len(initial))]
        if outer == "none":
            global_model = [g + d for g, d in zip(global_model, delta, strict=True)]
        else:  # Nesterov SGD on the gradient -delta, lr 0.7, momentum 0.9 (torch's formula)
            for i, d in enumerate(delta):
                grad = -d
                velocity[i] = grad.clone() if local_rounds == K2 else 0.9 * velocity[i] + grad
                global_model[i] = global_model[i] - 0.7 * (grad + 0.9 * velocity[i])
        workers = [[g.clone() for g in global_model] for _ in range(total)]
    return workers


INTRA_TS = {"inter": False, "intra": True, "max_greed": 0.5}  # workers pre-merge and relay (ENABLE_INTRA_TS)


@pytest.mark.parametrize(("outer", "tsengine"), [("none", None), ("outer_nesterov", None), ("none", INTRA_TS)],
                         ids=["plain", "outer_nesterov", "intra_tsengine"])
def test_hfa_matches_a_single_process_simulation(geomx_job, outer, tsengine):
    job = geomx_job("hfa_train.py", "--steps", str(STEPS), "--outer", outer, parties=PARTIES,
                    hfa={"k1": K1, "k2": K2}, tsengine=tsengine)
    job.assert_ok()
    workers = jobkit.load_worker_outputs(job.run_dir)
    assert sorted(workers) == [0, 1, 2]
    if tsengine is not None:  # dc0's local server coordinated its workers' rounds
        assert read_reports(job.run_dir)["dc0_server"]["rounds"] > 0
    initial = workers[0][0]["initial"]
    expected = simulate(initial, outer)
    for rank, (tensors, _) in workers.items():
        for got, want in zip(tensors["final"], expected[rank], strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=f"worker {rank}")
    # the last round (12 steps / K1 = 6 rounds, 6 % K2 == 0) was global: every party holds the same model
    for tensors, _ in workers.values():
        for got, want in zip(tensors["final"], workers[0][0]["final"], strict=True):
            assert torch.equal(got, want)
