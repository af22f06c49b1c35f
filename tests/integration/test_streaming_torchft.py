"""One real job held to torchft's recorded DiLoCo trajectory (issue 47, item 6; the in-process replay of every
recorded case is tests/unit/test_streaming_torchft.py, which says where the numbers come from).

torchft's mocked DiLoCo, delay 0 and alpha 0.5 (the case both fixed bugs show in: the signature taking a fragment in
a server party, alpha ignored without a delay), as geomx runs it: 2 parties of 1 worker, one ``lan: server`` and one
``lan: collective`` (both tiers split the model alike and mix alike), ``hfa: {k1: 1, k2: 6}``, outer SGD lr 2,
2 fragments. Every worker's weights after every step are torchft's, exactly.
"""

from __future__ import annotations

import torch
from harness import write_topology

# torchft 0.2.0, test_diloco_mocked_updates with fragment_sync_delay 0, fragment_update_alpha 0.5: layer 0's and
# layer 1's weight after each step 0..15
RECORDED = [[1, -1, -3, -8, -10, -12, -14, -16, -18, -24.5, -26.5, -28.5, -30.5, -32.5, -34.5, -40.25],
            [1, -1, -3, -5, -7, -9, -17, -19, -21, -23, -25, -27, -32, -34, -36, -38]]


def test_a_server_party_and_a_collective_party_land_on_torchfts_recorded_weights(geomx_job, tmp_path):
    path = write_topology(tmp_path / "torchft.yaml", parties={"dc0": 1, "dc1": 1}, hfa={"k1": 1, "k2": 6},
                          lan={"dc0": "server", "dc1": "collective"},
                          training={"server_optimizer": {"type": "sgd", "lr": 2}, "fragments": 2,
                                    "fragment_alpha": 0.5})
    job = geomx_job("diloco_mock.py", "--steps", "15", topology=path)
    job.assert_ok()
    workers = job.workers()
    assert sorted(workers) == [0, 1], "every worker reports"
    want = torch.tensor(RECORDED, dtype=torch.float32).T
    for rank, (tensors, report) in workers.items():
        assert report["mode"] == "HFA"
        torch.testing.assert_close(tensors["history"][0], want, rtol=0, atol=0, msg=f"worker {rank}")
