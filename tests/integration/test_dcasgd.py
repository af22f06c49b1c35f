"""MixedSync + DCASGD on real processes: the global server's updates replay as the paper's, one backup per party.

Two parties with one worker each push asynchronously. From what the workers recorded (the weights each
gradient was computed on, the gradient, the weights the answer carried) the test rebuilds the order the
global server applied the pushes in: at every point exactly one party's next push must turn the current
weights into what that party received, by ``w - lr * (g + lamda * g * g * (w - w_bak[party]))`` with
``w_bak[party]`` the weights the party held, the INIT weights for its first push. One backup per key
(GeoMX's; the server passing contributor "") or no backup before a party's first push does not replay.
"""

from __future__ import annotations

import jobkit

STEPS = 6


def recorded(workers):
    """party -> {name: float64 array} from the workers' outputs; and (lr, lamda)."""
    parties, hyper = {}, None
    for tensors, report in workers.values():
        parties[report["party"]] = {name: value.double().numpy()
                                    for name, value in zip(report["names"], tensors["values"], strict=True)}
        hyper = (report["lr"], report["lamda"])
    return parties, hyper


def replay(parties, key, lr, lamda):
    """The order of the pushes of ``key`` as the server applied them, and for each push whether plain SGD
    (no compensation: what an unseeded first push gets) would explain it too."""
    steps = {party: [(data[f"held/{i}/{key}"], data[f"grad/{i}/{key}"], data[f"received/{i}/{key}"])
                     for i in range(STEPS)] for party, data in parties.items()}
    return jobkit.dcasgd_order(steps, lr, lamda, f"key {key}")


def test_dcasgd_replays_with_one_backup_per_party_seeded_at_init(geomx_job):
    job = geomx_job("dcasgd_replay.py", "--steps", str(STEPS), parties={"dc0": 1, "dc1": 1})
    job.assert_ok()
    parties, (lr, lamda) = recorded(job.workers())
    assert sorted(parties) == ["dc0", "dc1"]
    for key in range(len(list(jobkit.make_model().parameters()))):
        order, plain_fits = replay(parties, key, lr, lamda)
        first_dc1 = order.index("dc1")
        assert order[:first_dc1].count("dc0") >= 2, order  # dc1 waited for two of dc0's steps
        # dc1's first push was compensated against the INIT weights: an uncompensated step does not fit it
        assert not plain_fits[first_dc1], (key, order, plain_fits)
