"""Decoupled outer rounds (``training.quorum``) with ``lan: collective`` parties: each rank sends its slices' deltas
unweighted with the party's tokens, and the global server counts the party once per slice. Every party on time, the
weights are today's (tokens proportional to ranks): the same bits as the synchronous rounds, for collective parties
and beside a server party; a slow collective party is answered at once and folded in, and the job ends."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from harness import write_topology

from geomx.runs.runlog import read_stats

SCRIPT = "frontend_train.py"
K1, SLICE_ELEMS = 2, 512
SPARSE2BIT = {"type": "sparse2bit", "density": 0.02, "chunk": 4096, "pull_density": 0.04}


def outer_rounds(job: Any) -> dict[str, Any]:
    """The global server's report of its decoupled rounds (its stats file)."""
    reports = [s["outer_rounds"] for s in read_stats(job.run_dir) if "outer_rounds" in s]
    assert len(reports) == 1, "one global server reports its rounds"
    return reports[0]


def finals(job: Any) -> dict[int, list[torch.Tensor]]:
    job.assert_ok()
    return {rank: tensors["final"] for rank, (tensors, _) in job.workers().items()}


TWO_COLLECTIVE = {"dc0": "collective", "dc1": "collective"}
STREAMING = {"fragments": 2, "fragment_delay": 1, "fragment_alpha": 0.25}


@pytest.mark.parametrize(("parties", "lan", "training", "args"), [
    ({"dc0": 2, "dc1": 2}, TWO_COLLECTIVE, {"server_optimizer": "outer_nesterov"}, [SCRIPT, "--momentum", "0"]),
    # a collective party beside a server party, streaming and overlapped, every worker reporting its batch as tokens
    ({"dc0": 2, "dc1": 1}, {"dc0": "collective"}, STREAMING,
     [SCRIPT, "--momentum", "0", "--party-batch", json.dumps({"dc0": 4, "dc1": 4})]),
    # the model sharded by FSDP2: each rank's owned slices leave from the shards
    ({"dc0": 2, "dc1": 2}, TWO_COLLECTIVE, {"server_optimizer": "outer_nesterov", **STREAMING},
     ["fsdp_train.py", "--fsdp"]),
], ids=["two_collective_parties", "collective_beside_a_server_party_streaming_overlapped", "fsdp2_streaming"])
def test_every_party_on_time_equals_the_synchronous_rounds_bit_for_bit(geomx_job, tmp_path: Path, parties, lan,
                                                                      training, args):
    k2, steps = 4, 16
    jobs = {}
    for name, extra in (("today", {}), ("decoupled", {"quorum": len(parties), "grace": "auto"})):
        path = write_topology(tmp_path / f"{name}.yaml", parties=parties, lan=lan, hfa={"k1": K1, "k2": k2},
                              training={**training, **extra}, slice_elems=SLICE_ELEMS)
        jobs[name] = geomx_job(args[0], "--steps", str(steps), *args[1:], topology=path, name=name)
    today, decoupled = finals(jobs["today"]), finals(jobs["decoupled"])
    assert sorted(today) == sorted(decoupled) == list(range(sum(parties.values())))
    for rank, tensors in today.items():
        for index, (got, want) in enumerate(zip(decoupled[rank], tensors, strict=True)):
            assert torch.equal(got, want), f"worker {rank} tensor {index}"
    report = outer_rounds(jobs["decoupled"])
    assert report["rounds"] > 0 and report["closed_by_grace"] == 0
    assert report["missed"] == {} and report["late_folded"] == {} and report["dropped"] == {}
    assert "dc0/ranks" in report["by_party"], "a collective party is one client, named after the party"
    assert set(report["on_time"].values()) == {report["rounds"]}, "every party made every round"


@pytest.mark.parametrize(("delay", "codec"), [(0, None), (1, None), (0, SPARSE2BIT)],
                         ids=["blocking", "overlapped", "blocking_sparse2bit"])
def test_a_slow_collective_party_is_folded_in_and_the_job_ends(geomx_job, tmp_path: Path, delay: int, codec):
    """quorum 2 of 3, grace 0: collective dc0 and server party dc1 close the rounds; collective dc2, 8x slower, is
    answered at once with the global model and its deltas folded into the open rounds (counted by party: its client,
    not a rank). Its ranks land those answers alike: they end with one model. With a residual WAN codec the owning
    ranks' deltas go up sparse (each rank's residual its own slices'), and are decoded before the merge."""
    parties = {"dc0": 2, "dc1": 1, "dc2": 2}
    training = {"quorum": 2, "grace": 0, "stale_rounds": 10, "server_optimizer": "outer_nesterov",
                **({"fragments": 2, "fragment_delay": delay} if delay else {}),
                **({"compression": codec} if codec else {})}
    path = write_topology(tmp_path / "slow.yaml", parties=parties, lan={"dc0": "collective", "dc2": "collective"},
                          hfa={"k1": K1, "k2": 2}, training=training, slice_elems=SLICE_ELEMS)
    job = geomx_job(SCRIPT, "--steps", "12", "--momentum", "0", "--step-s", "0.03", "--slow-rank", "3",
                    "--slowdown", "8", topology=path)
    final = finals(job)
    for first, second in ((0, 1), (3, 4)):  # a party's ranks hold one model
        for index, (a, b) in enumerate(zip(final[first], final[second], strict=True)):
            assert torch.equal(a, b), f"ranks {first} and {second}, tensor {index}"
    report = outer_rounds(job)
    assert report["missed"].get("dc2/ranks", 0) > 0 and report["closed_by_grace"] > 0, report
    assert report["late_folded"].get("dc2/ranks", 0) > 0 and report["dropped"] == {}, report
    assert "dc0/ranks" not in report["missed"], report
    assert all("/worker" not in name for name in report["by_party"]), "counted by party, not by rank"
    assert any("dc2/ranks" in r["folded"] for r in report["last_rounds"]), report["last_rounds"]
    if codec:  # the ranks' deltas went up sparse; the answers (the global model) come dense
        wan = {s["name"]: s["wan"] for s in read_stats(job.run_dir) if s.get("party") == "dc2"}
        assert wan and all(w["sent"] * 4 < w["recv"] for w in wan.values()), wan
