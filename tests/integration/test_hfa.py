"""HFA across real processes equals a single-process simulation of the algorithm (parties weighted by workers;
under decoupled rounds by the tokens they report, and, every party on time, today's synchronous rounds bit for bit)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import jobkit
import pytest
import torch

from geomx.algorithms.tsengine.rules import read_reports
from geomx.runs.runlog import read_stats

K1, K2, STEPS = 2, 3, 12
PARTIES = {"dc0": 2, "dc1": 1}  # unequal parties: the global average must weigh dc0 twice


@dataclass(frozen=True)
class Streaming:
    """Streaming outer sync: key -> its fragment, the fragments' count, the overlap (local rounds), the mix."""

    fragment_of: dict[int, int] = field(default_factory=lambda: {0: 0, 1: 0, 2: 0, 3: 0})
    fragments: int = 1
    delay: int = 0
    alpha: float = 0.0


def simulate(initial: list[torch.Tensor], outer: str, k2: int = K2, steps: int = STEPS,
             streaming: Streaming | None = None, shares: dict[str, float] | None = None,
             batches: list[int] | None = None) -> tuple[list[list[torch.Tensor]], list[torch.Tensor]]:
    """Every worker's final weights under HFA (streaming: fragments at staggered rounds, overlapped), and the
    global model every party holds at the end, computed in one process. ``shares``: each party's weight in the
    global average (default: its share of the workers; decoupled rounds: of the tokens); ``batches``: each rank's
    batch size (jobkit.local_sgd)."""
    streaming = streaming or Streaming()
    ranks_of = {"dc0": [0, 1], "dc1": [2]}
    total = sum(PARTIES.values())
    shares = shares or {p: n / total for p, n in PARTIES.items()}
    workers = [[w.clone() for w in initial] for _ in range(total)]
    global_model = [w.clone() for w in initial]
    velocity: list[torch.Tensor | None] = [None for _ in initial]
    in_flight: dict[int, tuple[int, torch.Tensor]] = {}  # key -> (the round that ends its overlap, new model)
    local_rounds = 0
    for step in jobkit.local_sgd(workers, steps, batches):
        if step % K1:
            continue
        local_rounds += 1
        for i in range(len(initial)):
            averages = {party: sum(workers[r][i] / len(ranks) for r in ranks) for party, ranks in ranks_of.items()}
            offset = (streaming.fragment_of[i] + 1) * k2 // streaming.fragments % k2
            answer: dict[str, torch.Tensor] = dict(averages)  # a local round: the party's average
            if i in in_flight and in_flight[i][0] == local_rounds:  # an overlap ends: the new model, mixed
                global_model[i] = in_flight.pop(i)[1]
                answer = {party: (1 - streaming.alpha) * global_model[i] + streaming.alpha * average
                          for party, average in averages.items()}
            elif local_rounds % k2 == offset:  # this key's fragment goes global
                delta = sum((averages[p] - global_model[i]) * shares[p] for p in PARTIES)
                if outer == "none":
                    new_model = global_model[i] + delta
                else:  # Nesterov SGD on the gradient -delta, lr 0.7, momentum 0.9 (torch's formula)
                    grad = -delta
                    velocity[i] = grad.clone() if velocity[i] is None else 0.9 * velocity[i] + grad
                    new_model = global_model[i] - 0.7 * (grad + 0.9 * velocity[i])
                if streaming.delay:
                    in_flight[i] = (local_rounds + streaming.delay, new_model)
                else:
                    global_model[i] = new_model
                    answer = {party: new_model for party in averages}
            for party, ranks in ranks_of.items():
                for r in ranks:
                    workers[r][i] = answer[party].clone()
    return workers, global_model


INTRA_TS = {"inter": False, "intra": True, "max_greed": 0.5}  # workers pre-merge and relay (ENABLE_INTRA_TS)


# Plain HFA (outer none, no TSEngine): the wrapper's run of this job, test_torch_frontend.py; the kvstore loop's
# outer "none" arithmetic is the intra_tsengine case's
@pytest.mark.parametrize(("outer", "tsengine"), [("outer_nesterov", None), ("none", INTRA_TS)],
                         ids=["outer_nesterov", "intra_tsengine"])
def test_hfa_matches_a_single_process_simulation(geomx_job, outer, tsengine):
    job = geomx_job("hfa_train.py", "--steps", str(STEPS), "--outer", outer, parties=PARTIES,
                    hfa={"k1": K1, "k2": K2}, tsengine=tsengine)
    job.assert_ok()
    workers = jobkit.load_worker_outputs(job.run_dir)
    assert sorted(workers) == [0, 1, 2]
    if tsengine is not None:  # dc0's local server coordinated its workers' rounds
        assert read_reports(job.run_dir)["dc0_server"]["rounds"] > 0
    initial = workers[0][0]["initial"]
    expected, _ = simulate(initial, outer)
    for rank, (tensors, _) in workers.items():
        for got, want in zip(tensors["final"], expected[rank], strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=f"worker {rank}")
    # the last round (12 steps / K1 = 6 rounds, 6 % K2 == 0) was global: every party holds the same model
    for tensors, _ in workers.values():
        for got, want in zip(tensors["final"], workers[0][0]["final"], strict=True):
            assert torch.equal(got, want)


# jobkit's model: keys 0 (2048 elements), 1 (64), 2 (192), 3 (3); two fragments by size: {0} and {1, 2, 3}
STREAMING_SPLIT = {0: 0, 1: 1, 2: 1, 3: 1}


@pytest.mark.parametrize(("outer", "streaming"), [
    ("none", Streaming(STREAMING_SPLIT, fragments=2)),
    # alpha 0.25, not 0.5: a mix with alpha and 1 - alpha swapped must not pass
    ("outer_nesterov", Streaming(STREAMING_SPLIT, fragments=2, delay=1, alpha=0.25)),
], ids=["fragments", "fragments_overlapped_outer_nesterov"])
def test_streaming_hfa_matches_a_single_process_simulation(geomx_job, outer, streaming):
    """Fragments go global at staggered rounds; overlapped, the workers go on from the party's average and the
    new global model (mixed) replaces it ``delay`` rounds later: the same weights as the simulation."""
    k2, steps = 4, 22  # 11 local rounds: fragment 0 goes global at 2, 6, 10, fragment 1 at 4, 8 (overlapped:
    # answered at 3, 7, 11 and 5, 9: nothing in flight at the end, so the job's model is known)
    training = {"fragments": streaming.fragments, "fragment_delay": streaming.delay,
                "fragment_alpha": streaming.alpha}
    job = geomx_job("hfa_train.py", "--steps", str(steps), "--outer", outer, parties=PARTIES,
                    hfa={"k1": K1, "k2": k2}, training=training)
    job.assert_ok()
    workers = jobkit.load_worker_outputs(job.run_dir)
    initial = workers[0][0]["initial"]
    expected, job_model = simulate(initial, outer, k2, steps, streaming)
    assert sorted(workers) == list(range(sum(PARTIES.values()))), "every worker reports"
    for rank, (tensors, _) in workers.items():
        for got, want in zip(tensors["final"], expected[rank], strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=f"worker {rank}")
        # the job's model (every fragment's last global model), as each party's local server holds it
        for got, want in zip(tensors["job_model"], job_model, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=f"job model, worker {rank}")
        # ... which is not the worker's own: the last round answered key 0 with a party average (or a mix)
        assert not torch.equal(tensors["job_model"][0], tensors["final"][0])


def final_weights(job) -> dict[int, dict[str, list[torch.Tensor]]]:
    job.assert_ok()
    return {rank: tensors for rank, (tensors, _) in jobkit.load_worker_outputs(job.run_dir).items()}


def outer_rounds(job) -> dict:
    """The global server's report of its decoupled rounds (its stats file)."""
    reports = [s["outer_rounds"] for s in read_stats(job.run_dir) if "outer_rounds" in s]
    assert len(reports) == 1, "one global server reports its rounds"
    return reports[0]


@pytest.mark.parametrize(("outer", "training"), [
    ("outer_nesterov", {}),
    ("none", {"fragments": 2, "fragment_delay": 1, "fragment_alpha": 0.25}),
], ids=["outer_nesterov", "streaming_overlapped"])
def test_decoupled_rounds_with_every_party_on_time_equal_synchronous_rounds_bit_for_bit(geomx_job, outer, training):
    """quorum = every party: each round closes when the last party is in, as today; the deltas go up unweighted
    with their tokens (none reported: 1 per worker and local round) and the global server weighs them by their
    share, which is each party's share of the workers: the same bits on every worker."""
    k2, steps = 4, 16
    args = ("hfa_train.py", "--steps", str(steps), "--outer", outer)
    options = {"parties": PARTIES, "hfa": {"k1": K1, "k2": k2}}
    today = final_weights(geomx_job(*args, name="today", training=training, **options))
    decoupled_job = geomx_job(*args, name="decoupled", training={**training, "quorum": 2, "grace": "auto"}, **options)
    decoupled = final_weights(decoupled_job)
    assert sorted(decoupled) == sorted(today) == [0, 1, 2]
    for rank, tensors in today.items():
        for name in ("final", "job_model"):
            for index, (got, want) in enumerate(zip(decoupled[rank][name], tensors[name], strict=True)):
                assert torch.equal(got, want), f"worker {rank} {name} tensor {index}"
    report = outer_rounds(decoupled_job)
    assert report["rounds"] > 0 and report["closed_by_grace"] == 0
    assert report["missed"] == {} and report["late_folded"] == {} and report["dropped"] == {}
    assert set(report["on_time"].values()) == {report["rounds"]}, "every party made every round"


def test_decoupled_rounds_weigh_the_parties_by_their_tokens(geomx_job):
    """The parties train on batches of other sizes and their workers report them: the global average weighs dc1
    (one worker, batches of 8) above dc0 (two workers, batches of 2): 8 / 12 against the workers' 1 / 3."""
    batch = {"dc0": 2, "dc1": 8}
    job = geomx_job("hfa_train.py", "--steps", str(STEPS), "--outer", "outer_nesterov", "--batch",
                    json.dumps(batch), parties=PARTIES, hfa={"k1": K1, "k2": K2}, training={"quorum": 2})
    workers = final_weights(job)
    count = sum(PARTIES[p] * batch[p] for p in PARTIES)
    batches = [batch["dc0"], batch["dc0"], batch["dc1"]]  # ranks 0 and 1 are dc0's, rank 2 is dc1's
    expected, _ = simulate(workers[0]["initial"], "outer_nesterov", batches=batches,
                           shares={p: PARTIES[p] * batch[p] / count for p in PARTIES})
    by_workers, _ = simulate(workers[0]["initial"], "outer_nesterov", batches=batches)
    assert not torch.allclose(expected[0][0], by_workers[0][0], rtol=1e-3, atol=1e-4), "the weights must matter"
    for rank, tensors in workers.items():
        for got, want in zip(tensors["final"], expected[rank], strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=f"worker {rank}")


def test_below_every_party_a_fast_party_never_waits_for_a_slow_one(geomx_job):
    """quorum 1 of 2, grace 0: dc0 closes its global rounds alone and lands their answers when they arrive; slow
    dc1's pushes, a round or more late, are answered at once and folded in or dropped (the round table's unit tests
    check the arithmetic with a fake clock). dc0's loop takes a fraction of dc1's, which sleeps 0.3 s a step; with
    quorum 2 it would wait for dc1 at every global round."""
    job = geomx_job("hfa_train.py", "--steps", str(STEPS), "--outer", "outer_nesterov", "--sleep",
                    json.dumps({"dc1": 0.3}), parties=PARTIES, hfa={"k1": K1, "k2": K2},
                    training={"quorum": 1, "grace": 0, "stale_rounds": 1})
    job.assert_ok()
    loops = {meta["party"]: meta["loop_s"] for _, meta in jobkit.load_worker_outputs(job.run_dir).values()}
    assert loops["dc1"] >= STEPS * 0.3
    assert loops["dc0"] < loops["dc1"] / 2, f"dc0 waited for dc1: {loops}"
    report = outer_rounds(job)
    [fast] = [name for name in report["on_time"] if "dc0" in name]
    [slow] = [name for name in report["missed"] if "dc1" in name]
    assert report["missed"][slow] > 0 and report["closed_by_grace"] > 0
    assert report["late_folded"].get(slow, 0) + report["dropped"].get(slow, 0) > 0, report
    assert fast not in report["missed"]
