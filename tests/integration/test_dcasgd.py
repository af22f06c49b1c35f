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
import numpy as np

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
    initial = {p: data[f"held/0/{key}"] for p, data in parties.items()}
    np.testing.assert_array_equal(initial["dc0"], initial["dc1"])  # both started from the master's weights
    w, position, order, plain_fits = initial["dc0"], {p: 0 for p in parties}, [], []
    while any(i < STEPS for i in position.values()):
        matches = []
        for party, i in position.items():
            if i == STEPS:
                continue
            data = parties[party]
            g, held, got = data[f"grad/{i}/{key}"], data[f"held/{i}/{key}"], data[f"received/{i}/{key}"]
            if np.allclose(w - lr * (g + lamda * g * g * (w - held)), got, rtol=1e-5, atol=1e-6):
                matches.append((party, got, np.allclose(w - lr * g, got, rtol=1e-5, atol=1e-6)))
        assert len(matches) == 1, (f"key {key} after {order}: {len(matches)} parties' next push explain the "
                                   "weights they received (want exactly one)")
        party, w, plain = matches[0]
        order.append(party)
        plain_fits.append(plain)
        position[party] += 1
    return order, plain_fits


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
