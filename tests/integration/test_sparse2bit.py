"""HFA + the sparse 2-bit codec (issue 48) across real processes equals a single-process simulation of the same
arithmetic: each party's weighted delta compressed with its own residual, the global model moved by their decoded
sum, and its change answered compressed with the global server's residual, which every party adds to the global
model it holds."""

from __future__ import annotations

import json

import jobkit
import numpy as np
import torch

from geomx.codecs import Sparse2Bit, TensorInfo
from geomx.core.sharding import ShardPlanner

PARTIES = {"dc0": 2, "dc1": 1}  # unequal parties: dc0's delta weighs 2/3, dc1's 1/3
K1, K2, STEPS = 2, 2, 16  # a global round every 4 steps: 4 of them, so both directions' residuals carry over
SLICE_ELEMS = 1000  # jobkit's model: keys of 2048 (3 slices of 682-683), 64, 192 and 3 elements
DENSITY, CHUNK = 0.05, 256  # slices of several full chunks and a partial one; 13 of 256 kept
SPEC = {"type": "sparse2bit", "density": DENSITY, "chunk": CHUNK}
F32 = np.dtype(np.float32)


def simulate(initial: list[torch.Tensor], push: bool = True, pull: bool = True) -> list[list[torch.Tensor]]:
    """Every worker's final weights: local SGD, a local round every K1 steps (the party's average), every K2-th a
    global one. There, per slice: each party pushes ``(average - G) * weight`` through its codec, the global server
    adds the decoded sum to its model V and answers ``V_new - V`` through its own codec, and every party's G (and
    its workers) becomes ``G + answer``. ``push`` / ``pull`` False: that direction dense (the variants the job must
    not match)."""
    ranks_of = {"dc0": [0, 1], "dc1": [2]}
    total = sum(PARTIES.values())
    weight = {party: np.float32(count / total) for party, count in PARTIES.items()}
    codecs = {party: Sparse2Bit(DENSITY, CHUNK) for party in PARTIES}
    server = Sparse2Bit(DENSITY, CHUNK)
    workers = [[w.clone() for w in initial] for _ in range(total)]
    held = [w.detach().reshape(-1).numpy().copy() for w in initial]  # G: the global model every party holds
    value = [w.copy() for w in held]  # V: the global server's
    planner = ShardPlanner(1, SLICE_ELEMS)  # the slices every server cuts (one global server)
    slices = [[(span.start, span.stop) for span in planner.place(w.numel(), 4)] for w in initial]
    for step in jobkit.local_sgd(workers, STEPS):
        if step % K1:
            continue
        for key, w0 in enumerate(initial):
            averages = {party: sum(workers[r][key] / len(ranks) for r in ranks) for party, ranks in ranks_of.items()}
            if step // K1 % K2:  # a local round: each party's workers take its average
                answers = averages
            else:
                flat = {party: a.reshape(-1).numpy() for party, a in averages.items()}
                for index, (a, b) in enumerate(slices[key]):
                    summed = None
                    for party in PARTIES:
                        delta = np.subtract(flat[party][a:b], held[key][a:b], dtype=np.float32) * weight[party]
                        sent = codec_round(codecs[party], delta, key, index, "push") if push else delta
                        summed = sent if summed is None else summed + sent
                    new = value[key][a:b] + summed
                    change = new - value[key][a:b]
                    value[key][a:b] = new
                    held[key][a:b] += codec_round(server, change, key, index, "pull") if pull else change
                answers = {party: torch.from_numpy(held[key].copy()).reshape(w0.shape) for party in PARTIES}
            for party, ranks in ranks_of.items():
                for r in ranks:
                    workers[r][key] = answers[party].clone()
    return workers


def codec_round(codec: Sparse2Bit, array: np.ndarray, key: int, index: int, direction: str) -> np.ndarray:
    """What the receiver decodes of ``array`` sent through ``codec`` (its residual kept per key, slice, direction)."""
    info = TensorInfo(key=key, slice=index, kind="delta", direction=direction)  # type: ignore[arg-type]
    return codec.decode(codec.encode(array, info), array.shape, F32)


def test_hfa_with_sparse2bit_matches_a_simulation_of_the_same_arithmetic(geomx_job):
    """Every worker ends with the simulation's weights (seen: bit for bit); the simulation with either direction
    dense (parties pushing dense deltas, or the global server answering its model's change uncompressed) ends far
    from them, so both directions' codecs and residuals are in force; and each direction's WAN bytes over the job
    stay below what its global rounds alone would cost dense."""
    job = geomx_job("hfa_train.py", "--steps", str(STEPS), "--compression", json.dumps(SPEC), parties=PARTIES,
                    hfa={"k1": K1, "k2": K2}, slice_elems=SLICE_ELEMS)
    job.assert_ok()
    workers = jobkit.load_worker_outputs(job.run_dir)
    assert sorted(workers) == [0, 1, 2]
    initial = workers[0][0]["initial"]
    expected = simulate(initial)
    for rank, (tensors, _) in workers.items():
        for got, want in zip(tensors["final"], expected[rank], strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=f"worker {rank}")
    # the last round (16 steps / K1 = 8 rounds, 8 % K2 == 0) was global: every party holds the same model
    for tensors, _ in workers.values():
        assert all(torch.equal(a, b) for a, b in zip(tensors["final"], workers[0][0]["final"], strict=True))
    final = torch.cat([t.reshape(-1) for t in workers[0][0]["final"]])
    for push, pull in ((True, False), (False, True)):
        other = torch.cat([t.reshape(-1) for t in simulate(initial, push, pull)[0]])
        gap = float((other - final).abs().max())
        assert gap > 1e-3, (push, pull, gap)  # seen: 0.04-0.05, far beyond the tolerance above
    # dense, dc1's deltas up and the answers down would each cost the model's bytes per global round (dc0 shares
    # its host with the global server: not WAN); seen: 10 KB and 15 KB in all (heartbeats and registration too)
    dense = STEPS // (K1 * K2) * jobkit.param_bytes()
    by_party = job.summary["wan_bytes_sent_by_party"]
    assert by_party["dc1"] < dense and by_party["dc0"] < dense, (by_party, dense)
