"""The PyTorch front end across real processes: a plain loop wrapped in DistributedOptimizer.

The algorithm is chosen by the topology's ``training`` block only; the worker script never changes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jobkit
import pytest
import torch
import torch.nn.functional as F
import yaml
from harness import run_job, write_topology
from test_hfa import simulate as simulate_hfa

from geomx.algorithms.tsengine.rules import read_reports as read_ts_reports

SCRIPT = "frontend_train.py"


def topology(tmp_path: Path, training: dict[str, Any] | None = None, **options: Any) -> Path:
    """harness.write_topology plus a ``training`` block."""
    path = write_topology(tmp_path / "frontend.yaml", **options)
    if training is not None:
        raw = yaml.safe_load(path.read_text())
        raw["training"] = training
        path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def single_process(optimizer: str, steps: int = jobkit.STEPS) -> list[torch.Tensor]:
    """One worker's loop without geomx: the master's seed, its batches, the same torch optimizer."""
    torch.manual_seed(jobkit.seed_for(0))
    model = jobkit.make_model()
    inner = {"adam": lambda: torch.optim.Adam(model.parameters(), lr=jobkit.LR),
             "adamw": lambda: torch.optim.AdamW(model.parameters(), lr=jobkit.LR)}[optimizer]()
    inputs, targets = jobkit.make_data(steps, 1)
    for step in range(steps):
        inner.zero_grad()
        F.mse_loss(model(inputs[step, 0]), targets[step, 0]).backward()
        inner.step()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize(("server_optimizer", "mode"), [("auto", "LOCAL"), ("translate", "SERVER")],
                         ids=["sgd-on-the-workers", "sgd-translated-to-the-servers"])
def test_wrapped_loop_equals_the_kvstore_loop_under_fsa(geomx_job, standard_hips_job, tmp_path, request,
                                                        server_optimizer, mode):
    """Same model, data and SGD as the kvstore loop (train.py, SGD on the global server): under FSA the wrapper
    steps torch's SGD on every worker on the mean gradient (auto), or translates it onto the servers. The
    translated case is the P3 test's job (conftest's ``p3_job``: P3 and DGT without loss change only the order, so
    the weights are the same)."""
    if server_optimizer == "translate":
        job = request.getfixturevalue("p3_job")(False)
    else:
        job = geomx_job(SCRIPT, topology=topology(tmp_path, {"server_optimizer": server_optimizer}))
    job.assert_ok()
    workers = job.workers()
    assert sorted(workers) == [0, 1, 2, 3]
    jobkit.assert_fsa_equivalent(workers, num_workers=4)
    standard_hips_job.assert_ok()
    kvstore = standard_hips_job.workers()
    for rank, (tensors, report) in workers.items():
        assert report["mode"] == mode
        for got, want in zip(tensors["final"], kvstore[rank][0]["final"], strict=True):
            torch.testing.assert_close(got, want)
    # the run folder holds per-step metrics: steps, losses, traffic, time blocked on the network
    from geomx.runs.runlog import read_metrics
    records = read_metrics(job.run_dir)["dc0_worker0"]
    assert records[-1]["step"] == jobkit.STEPS
    assert records[-1]["lan_bytes"] > 0 and records[-1]["net_wait_s"] >= 0 and "loss" in records[-1]


@pytest.mark.parametrize(("optimizer", "server_optimizer", "mode"), [
    ("adam", "translate", "SERVER"), ("adam", "auto", "LOCAL")],
    ids=["adam-translated-to-the-server", "adam-stepped-locally"])
def test_one_worker_equals_single_process_training(geomx_job, optimizer, server_optimizer, mode):
    """Adam runs on the global server when translated; by default the optimizer steps on the worker on the
    averaged gradient. (AdamW always steps locally, having no server twin: that choice is
    tests/unit/test_torch_frontend_parts.py's; its local step is the same path as Adam's here.)"""
    job = geomx_job(SCRIPT, "--optimizer", optimizer, parties={"dc0": 1},
                    training={"server_optimizer": server_optimizer})
    job.assert_ok()
    (tensors, report), = job.workers().values()
    assert report["mode"] == mode
    for index, (got, want, start) in enumerate(zip(tensors["final"], single_process(optimizer),
                                                   tensors["after_init"], strict=True)):
        assert not torch.equal(got, start), f"parameter {index} was not trained"
        torch.testing.assert_close(got, want, msg=lambda m, i=index: f"parameter {i}: {m}")


@pytest.mark.parametrize("intra_ts", [False, True], ids=["p3", "p3_intra_tsengine"])
def test_p3_changes_only_the_order_and_the_next_forward_starts_early(p3_job, intra_ts):
    """P3 slices (64 elements here) over a slow WAN and two global servers (slices spread over both): the same
    weights as without P3, and forwards that start while deeper layers' updates are still on their way. Also
    with TSEngine inside the parties (every slice's push held, paired, relayed). (conftest's ``p3_job``: the same
    jobs carry DGT without loss, test_multigps's P3 + DGT test.)"""
    job = p3_job(intra_ts)
    job.assert_ok()
    workers = job.workers()
    jobkit.assert_fsa_equivalent(workers, num_workers=4)
    # P3 cut every tensor into slices of at most 64 elements, the bigger ones spread over both global servers
    # (without P3 each of these small tensors travels whole, to one server)
    sizes = [p.numel() for p in jobkit.make_model().parameters()]
    for _, report in workers.values():
        for size, slices in zip(sizes, report["slices"], strict=True):
            assert slices[0][0] == 0 and slices[-1][1] == size, slices
            assert all(stop - start <= 64 for start, stop, _ in slices), (size, slices)
            if size > 64:
                assert {shard for _, _, shard in slices} == {0, 1}, (size, slices)
    overlap = [report["overlap"] for _, report in workers.values()]
    assert all(o["forwards"] == jobkit.STEPS for o in overlap), overlap
    # loosely: at least one worker began a forward before all of the previous step's answers had arrived
    assert sum(o["forwards_before_all_arrived"] for o in overlap) >= 1, overlap
    if intra_ts:  # both local servers coordinated their workers' slices
        reports = read_ts_reports(job.run_dir)
        assert reports["dc0_server"]["rounds"] > 0 and reports["dc1_server"]["rounds"] > 0, sorted(reports)


def test_mixed_sync_with_dcasgd_from_the_topology(geomx_job, tmp_path):
    """dist_async + DCASGD chosen in the topology; one party has no staleness, so it is momentum SGD. The same
    block asks for TensorBoard: every worker writes its event file."""
    path = topology(tmp_path, {"sync": "dist_async", "server_optimizer": {"type": "dcasgd", "momentum": 0.9},
                               "tensorboard": True}, parties={"dc0": 2})
    job = geomx_job(SCRIPT, topology=path)
    job.assert_ok()
    jobkit.assert_fsa_equivalent(job.workers(), num_workers=2)
    for worker in ("dc0_worker0", "dc0_worker1"):
        events = list((job.run_dir / "tensorboard" / worker).glob("events.out.tfevents.*"))
        assert len(events) == 1 and events[0].stat().st_size > 200, (worker, events)


def test_decoupled_hfa_through_the_wrapper_weighs_the_parties_by_their_steps_tokens(geomx_job, tmp_path):
    """quorum 2 (every party): the script reports each step's batch, opt.step(tokens=batch); dc0's two workers
    train on batches of 2, dc1's one on batches of 8: the global average weighs dc1 8 / 12, as the simulation."""
    from test_hfa import K1, K2, PARTIES, STEPS

    batch = {"dc0": 2, "dc1": 8}
    path = topology(tmp_path, {"server_optimizer": "outer_nesterov", "quorum": 2}, parties=PARTIES,
                    hfa={"k1": K1, "k2": K2})
    job = geomx_job(SCRIPT, "--steps", str(STEPS), "--momentum", "0", "--party-batch", json.dumps(batch),
                    topology=path)
    job.assert_ok()
    workers = job.workers()
    count = sum(PARTIES[p] * batch[p] for p in PARTIES)
    expected, _ = simulate_hfa(workers[0][0]["after_init"], "outer_nesterov", K2, STEPS,
                               shares={p: PARTIES[p] * batch[p] / count for p in PARTIES},
                               batches=[batch["dc0"], batch["dc0"], batch["dc1"]])
    for rank, (tensors, _) in workers.items():
        for got, want in zip(tensors["final"], expected[rank], strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=f"worker {rank}")


@pytest.mark.parametrize(("outer", "streaming"), [("none", False), ("outer_nesterov", True)],
                         ids=["none", "outer_nesterov_streaming"])
def test_hfa_through_the_wrapper_matches_the_simulation(geomx_job, tmp_path, outer, streaming):
    """HFA under the wrapper, as in test_hfa; streaming (2 fragments, overlap 1, mix 0.25) from the training block.
    The outer optimizer without streaming is test_hfa's [outer_nesterov] (the same servers, the same
    simulation); the wrapper's part, naming the outer optimizer from the training block, is checked here by
    [outer_nesterov_streaming]."""
    from test_hfa import K1, K2, PARTIES, STEPS, STREAMING_SPLIT, Streaming

    k2, steps = (4, 22) if streaming else (K2, STEPS)
    options = {"fragments": 2, "fragment_delay": 1, "fragment_alpha": 0.25} if streaming else {}
    path = topology(tmp_path, {"server_optimizer": outer, **options}, parties=PARTIES, hfa={"k1": K1, "k2": k2})
    job = geomx_job(SCRIPT, "--steps", str(steps), "--momentum", "0", topology=path)
    job.assert_ok()
    workers = job.workers()
    initial = workers[0][0]["after_init"]
    plan = Streaming(STREAMING_SPLIT, fragments=2, delay=1, alpha=0.25) if streaming else Streaming()
    expected, _ = simulate_hfa(initial, outer, k2, steps, plan)
    assert sorted(workers) == list(range(sum(PARTIES.values()))), "every worker reports"
    for rank, (tensors, report) in workers.items():
        assert report["mode"] == "HFA"
        for got, want in zip(tensors["final"], expected[rank], strict=True):
            torch.testing.assert_close(got, want)


def test_a_worker_with_a_different_model_fails_at_start(geomx_job):
    job = geomx_job(SCRIPT, "--mismatch-rank", "1", parties={"dc0": 1, "dc1": 1})
    assert job.result.exit_code != 0
    assert job.result.failed == "dc1/worker0", job.tail()
    assert "ModelMismatchError" in job.output
    assert "the first difference is parameter 0 ('0.weight', shape (65, 32)): 2,080 elements here, 2,048" \
           in job.output, job.tail()
    assert job.result.wall_s < 60


def test_fp16_wan_codec_from_the_topology_stays_close_to_fsa(geomx_job, tmp_path):
    """The master sets the topology's codec; fp16 on the WAN rounds the gradient sums, nothing more."""
    job = geomx_job(SCRIPT, topology=topology(tmp_path, {"compression": {"type": "fp16"}},
                                              parties={"dc0": 1, "dc1": 1}))
    job.assert_ok()
    _, final = jobkit.reference_run(2)
    workers = job.workers()
    assert sorted(workers) == [0, 1]
    for tensors, report in workers.values():
        assert report["mode"] == "LOCAL"
        for got, want in zip(tensors["final"], final, strict=True):
            torch.testing.assert_close(got, want, atol=5e-3, rtol=5e-3)
    # fp16 really rounded something on the way (the same job in fp32 matches to fp32 tolerance, see above)
    assert any(not torch.equal(got, want) for got, want in zip(workers[0][0]["final"], final, strict=True))


def test_esync_through_the_wrapper_ends_together(geomx_job, tmp_path):
    """ESync's local step counts differ per worker: worker 1's device (dc1's) is 4x slower, so the state server
    gives worker 0 more local steps per round (K1 = 2 is the slowest's). Its data (7 steps) ends first, that
    round is the last, and worker 1 trains fewer steps; both end with the same (global) model. With K1 steps
    for everyone, both would train all 7."""
    path = topology(tmp_path, {"esync": True}, hfa={"k1": 2, "k2": 1}, parties={"dc0": 1, "dc1": 1})
    job = geomx_job(SCRIPT, "--steps", "7", "--momentum", "0", "--step-s", "0.05", "--slow-rank", "1",
                    "--slowdown", "4", topology=path)
    job.assert_ok()
    workers = job.workers()
    assert sorted(workers) == [0, 1]
    trained = {rank: report["trained_steps"] for rank, (_, report) in workers.items()}
    # the fast one's assignment follows measured step times (noisy under load): checked loosely
    assert trained[0] == 7 and trained[1] < 7, trained
    jobkit.assert_one_trained_model(workers, "ESYNC")


def test_under_contention_shallow_layers_arrive_first_with_p3(geomx_job, tmp_path):
    """A small first layer and a 480K-element deepest one on a 20 Mbit/s WAN; backward pushes the deepest first,
    then computes a while before the first layer's gradient. With P3 the deepest travels as 50K-element
    slices and the first layer's overtakes the queued ones, so the next forward gets its first layer while
    the deepest is still on its way. Without P3 the deepest is already on the wire, whole, ahead of it (1M-element
    slices, GeoMX's bound, asked for: a multi-party job's default 256K would cut the 480K one in two). One
    worker per party: the contention is on each local server's WAN link, which a second worker per party only
    makes busier (2 x 2 was measured alike, at twice the CPU)."""
    counts = {}
    for p3 in (True, False):
        path = topology(tmp_path / f"p3-{p3}", {"p3": p3}, links={"wan": {"bandwidth": "20Mbit", "latency": "5ms"}},
                        slice_elems=1 << 20, parties={"dc0": 1, "dc1": 1})
        job = geomx_job(SCRIPT, "--deep-head", "20000", "--steps", "4", topology=path, name=f"p3-{p3}")
        job.assert_ok()
        counts[p3] = [report["overlap"]["first_layer_before_deepest"] for _, report in job.workers().values()]
    # 2 workers x 3 forwards that follow a step (seen: [3, 3] with P3, [0, 0] without); loose bounds: the order
    # comes from timing under load
    assert len(counts[True]) == 2 and sum(counts[True]) >= 3, counts
    assert sum(counts[False]) < sum(counts[True]), counts


@pytest.fixture(scope="module")
def compiled_job(tmp_path_factory: pytest.TempPathFactory):
    """``torch.compile`` (inductor), the optimizer on the global servers, two parties of one worker: dc0's worker
    wraps the compiled module, dc1's the module it compiled (``--compile-late-rank 1``). One job for both cases of
    the compiled-model test."""
    folder = tmp_path_factory.mktemp("compiled")
    path = topology(folder, {"server_optimizer": "translate"}, parties={"dc0": 1, "dc1": 1})
    return run_job(folder, SCRIPT, "--compile", "inductor", "--compile-late-rank", "1", topology=path)


@pytest.mark.parametrize("late", [False, True], ids=["compiled-module-wrapped", "compiled-after-wrapping"])
def test_a_compiled_model_trains_every_parameter_as_the_uncompiled_one(compiled_job, late):
    """``torch.compile`` (inductor) with the optimizer on the global servers, whose answers land before the forward
    that needs them: every parameter trains, to the single-process reference's weights, under the uncompiled
    model's names, whether the wrapper gets the compiled module or the one it wraps (its hooks run eagerly inside
    the compiled forward either way, never traced into the graph). Both ways run in ``compiled_job``, one per
    worker: each case checks its own worker (rank 0 wrapped the compiled module, rank 1 the one it compiled)."""
    job = compiled_job
    job.assert_ok()
    workers = job.workers()
    _, final = jobkit.reference_run(2)
    assert sorted(workers) == [0, 1]
    tensors, report = workers[1 if late else 0]
    assert report["compile_late"] is late, report
    assert report["mode"] == "SERVER"
    assert report["names"] == ["0.weight", "0.bias", "2.weight", "2.bias"]
    for index, (got, want, start) in enumerate(zip(tensors["final"], final, tensors["after_init"], strict=True)):
        assert not torch.equal(got, start), f"parameter {index} was not trained"
        torch.testing.assert_close(got, want, msg=lambda m, i=index: f"parameter {i}: {m}")


def single_process_cnn(steps: int, batch: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The uncompiled CNN trained in one process as the FSA job trains it (frontend_train.py ``--conv-head``): the
    master's initial model, torch's SGD with momentum on the mean loss over both workers' first ``batch`` examples.
    Returns (initial weights, final weights)."""
    from frontend_train import ConvHead

    torch.manual_seed(jobkit.seed_for(0))
    jobkit.make_model()  # frontend_train.py builds the MLP first: the CNN's weights are the generator's next draws
    model = ConvHead()
    initial = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=jobkit.LR, momentum=jobkit.MOMENTUM)
    inputs, targets = jobkit.make_data(steps, 2)
    for step in range(steps):
        optimizer.zero_grad()
        F.mse_loss(model(inputs[step, :, :batch].reshape(-1, jobkit.IN_FEATURES)),
                   targets[step, :, :batch].reshape(-1, jobkit.OUT_FEATURES)).backward()
        optimizer.step()
    return initial, [p.detach().clone() for p in model.parameters()]


def test_a_compiled_cnn_trains_its_conv_layers_as_the_uncompiled_one(geomx_job, tmp_path):
    """Issue 46: ``DistributedOptimizer(opt, torch.compile(cnn))`` left the conv layers at their initial values under
    the default plan (torch 2.13's inductor compiles the backward of conv-ReLU-conv-ReLU-MaxPool2d-Linear-ReLU-Linear
    wrong when it gets it whole, at some batch sizes (5 here, not 8): zero gradients before the pool, with or without
    geomx; the wrapper's hooks, traced into the graph with nothing to wait for, left it whole). Run eagerly, a graph
    break at each layer, they keep it right: the same weights as the uncompiled CNN's (trained in this process on
    both workers' batches, as FSA does), every parameter trained."""
    job = geomx_job(SCRIPT, "--conv-head", "--batch", "5", "--compile", "inductor",
                    topology=topology(tmp_path, parties={"dc0": 1, "dc1": 1}), name="compiled-cnn")
    job.assert_ok()
    workers = job.workers()
    assert sorted(workers) == [0, 1] and workers[0][1]["mode"] == "LOCAL"
    compiled = workers[0][0]
    initial, uncompiled = single_process_cnn(jobkit.STEPS, 5)
    for got, want in zip(compiled["after_init"], initial, strict=True):
        assert torch.equal(got, want), "the reference does not start from the job's model"
    for index, (got, want, start) in enumerate(zip(compiled["final"], uncompiled, compiled["after_init"],
                                                   strict=True)):
        assert not torch.equal(got, start), f"parameter {index} was not trained"
        torch.testing.assert_close(got, want, msg=lambda m, i=index: f"parameter {i}: {m}")
