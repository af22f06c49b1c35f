"""Parties whose LAN tier is torch.distributed (``lan: collective``): real ranks over gloo inside each party,
each rank syncing its own slices with the global servers. Every data path against a single-process reference."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jobkit
import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml
from harness import write_topology

from geomx.runs.checkpoint import load_latest
from geomx.runs.runlog import read_stats

SCRIPT = "frontend_train.py"


def topology(tmp_path: Path, lan: dict[str, str], training: dict[str, Any] | None = None,
             top: dict[str, Any] | None = None, **options: Any) -> Path:
    """harness.write_topology, with each party's ``lan`` tier, a ``training`` block and other ``top`` fields."""
    path = write_topology(tmp_path / "collective.yaml", lan=lan, training=training, **options)
    if top:
        path.write_text(yaml.safe_dump({**yaml.safe_load(path.read_text()), **top}, sort_keys=False))
    return path


@pytest.mark.parametrize(("lan", "server_optimizer", "mode", "bucket_mb", "accumulate"), [
    ({"dc0": "collective", "dc1": "collective"}, "auto", "LOCAL", 0.001, 1),
    ({"dc0": "collective", "dc1": "server"}, "translate", "SERVER", 25, 2)],
    ids=["two-collective-parties-sgd-on-every-rank-a-bucket-per-tensor",
         "mixed-parties-sgd-on-the-servers-two-micro-batches"])
def test_fsa_in_collective_parties_equals_single_process_sgd(geomx_job, tmp_path, monkeypatch, lan,
                                                             server_optimizer, mode, bucket_mb, accumulate):
    """2 parties x 2 ranks, slices small enough that each rank owns some, gradients reduce-scattered as backward
    makes them (1 KB buckets: each tensor its own) or in one bucket: every rank ends with the weights of one
    process training on all four ranks' batches, bit for bit the same on every rank. Where the servers only sum,
    the last party's owning rank gets the others' sum early (the trace shows them) and adds its own. The second case
    takes each batch in two micro-batches, the first backward inside ``opt.no_sync()`` (see the next test)."""
    from geomx.transport.trace import read_trace

    monkeypatch.setenv("GEOMX_TRACE", "1")
    # heartbeats (and so the model digests, about one each) every 50 ms: a few digests in a job of a few seconds
    path = topology(tmp_path, lan, {"server_optimizer": server_optimizer, "bucket_mb": bucket_mb}, slice_elems=512,
                    timeouts={"heartbeat_interval": "50ms"})
    job = geomx_job(SCRIPT, "--accumulate", str(accumulate), topology=path)
    job.assert_ok()
    early = [e for e in read_trace([job.run_dir]) if e["node"].startswith("global_server")
             and e["event"] == "queue" and e["kind"] == "PUSHPULL" and not e["reply"]]
    if mode == "LOCAL":  # a plain sum: one early answer per slice and step, each to a collective party's rank
        assert len(early) >= jobkit.STEPS * 5, len(early)
        assert all("/worker/" in e["peer"] for e in early), {e["peer"] for e in early}
    else:  # the servers answer with weights: none goes early
        assert early == []
    assert_ranks_push_bundles(job, lan)
    workers = job.workers()
    assert {report["mode"] for _, report in workers.values()} == {mode}
    jobkit.assert_fsa_equivalent(workers, num_workers=4)
    assert "dc0/scheduler" not in job.output and "[dc0/server]" not in job.output  # no local tier for dc0
    assert_model_digests_agree(job)


def assert_model_digests_agree(job) -> None:
    """Every worker holds the job's model at the steps its strategy says every party does: its model digests (each
    worker's last few, in its stats file) agree at every step workers of two parties or more digested, and one
    such step is past the start (the job's topology sets a short heartbeat interval: about one digest each)."""
    digests: dict[int, dict[str, str]] = {}
    for stats in read_stats(job.run_dir):
        if stats.get("role") == "worker":
            assert stats["models"], f"{stats['name']} digested its model"
            for step, digest in stats["models"].items():
                digests.setdefault(int(step), {})[stats["name"]] = digest
    compared = {step: found for step, found in digests.items() if len({name.split("/")[0] for name in found}) > 1}
    assert any(step > 0 for step in compared), digests
    assert all(len(set(found.values())) == 1 for found in compared.values()), compared
    assert "disagree on the model" not in job.output


def assert_ranks_push_bundles(job: Any, lan: dict[str, str]) -> None:
    """A collective party's rank sends the slices it owns of a bucket for one global server as one BUNDLE (each
    rank owns several slices here), answered as one; a party with a local server sends a PUSHPULL per slice, and
    the global server answers a bundle only with a bundle."""
    from geomx.transport.trace import read_trace

    events = read_trace([job.run_dir])
    for party, tier in lan.items():
        up = [e for e in events if e["node"].startswith(f"{party}/") and e["event"] == "queue" and not e["reply"]
              and "/global_server/" in e["peer"]]
        kinds = {e["kind"] for e in up}
        if tier == "collective":
            assert "BUNDLE" in kinds, (party, kinds)
            bundles = [e for e in up if e["kind"] == "BUNDLE"]
            assert len(bundles) >= jobkit.STEPS, (party, len(bundles))
        else:
            assert "BUNDLE" not in kinds and "PUSHPULL" in kinds, (party, kinds)
    answers = [e for e in events if e["node"].startswith("global_server") and e["event"] == "queue" and e["reply"]]
    bundled = {e["peer"] for e in answers if e["kind"] == "BUNDLE"}
    assert bundled and all("/worker/" in peer for peer in bundled), bundled


@pytest.mark.parametrize("lan", ["collective", "server"])
def test_a_party_alone_in_its_job_takes_its_own_push_as_the_answer(geomx_job, tmp_path, lan):
    """A job of one party under FSA: the others' sum is empty, so the global server answers each push without a
    tensor (``ALONE``, geomx.core.early) and the party takes what it pushed. The answers' bytes stop crossing;
    the job is still one process's SGD. With early answers off, the global server sends the sums back. (A server
    party's answers are its local server's, whatever its workers: it has one.)"""
    sent = {}
    workers = 2 if lan == "collective" else 1
    for early in (True, False):
        path = topology(tmp_path / str(early), {"dc0": lan}, top={"early_answers": early}, parties={"dc0": workers},
                        slice_elems=512)
        job = geomx_job(SCRIPT, topology=path, name=f"{lan}-early-{early}")
        job.assert_ok()
        jobkit.assert_fsa_equivalent(job.workers(), num_workers=workers)
        to_global = links_to_global_servers(read_stats(job.run_dir))
        sent[early] = (sum(link["recv"] for link in to_global), sum(link["sent"] for link in to_global))
    (alone, pushes), (full, pushes_off) = sent[True], sent[False]
    assert abs(pushes - pushes_off) <= 0.02 * pushes_off, sent  # the pushes cross as before
    assert full - alone > 0.9 * jobkit.STEPS * jobkit.param_bytes(), sent  # no step's answer carries the model


def links_to_global_servers(stats: list[dict[str, Any]], party: str | None = None) -> list[dict[str, Any]]:
    """Each party process's link to a global server (``party``'s only, if given), from a run's stats files: the
    rounds' bytes, without the heartbeats to the schedulers (whose count grows with the job's wall time, and whose
    reports grow with the counters they carry)."""
    return [link for entry in stats if entry.get("role") != "global_server"
            and (party is None or entry.get("party") == party)
            for peer, link in entry.get("peers", {}).items() if "/global_server/" in peer]


K1, K2 = 2, 2  # blocking: a global round every K1 * K2 = 4 steps
SLICE_ELEMS = 512


def simulate_collective_hfa(initial: list[torch.Tensor], parties: dict[str, int], outer: str, k2: int = K2,
                            steps: int = 12, fragments: int = 1, delay: int = 0, alpha: float = 0.0,
                            lr: float = jobkit.LR, clip: float | None = None, dtype: torch.dtype = torch.float32
                            ) -> tuple[dict[str, list[torch.Tensor]], list[torch.Tensor]]:
    """HFA over collective parties in one process: each party steps SGD on its ranks' mean gradient (DDP), and
    every K1 steps is a local round; a slice goes global on its fragment's rounds (every K2), where the global
    model moves by the parties' weighted deltas (or an outer Nesterov step); overlapped (``delay``), every party
    goes on and ``delay`` rounds later takes ``(1 - alpha) * global + alpha * its own``; ``clip``: each party's
    mean gradient clipped to that norm; ``dtype``: the parties' models' (bfloat16: their gradients summed and stepped
    in it, the global model float32, as geomx holds it). Returns each party's model and the global model."""
    from geomx.algorithms.hfa.rules import LocalFrequencyAggregation
    from geomx.core.sharding import slice_plan

    total = sum(parties.values())
    ranks_of, first = {}, 0
    for party, count in parties.items():
        ranks_of[party], first = list(range(first, first + count)), first + count
    models = {party: [w.clone().reshape(-1).to(dtype) for w in initial] for party in parties}
    global_model = [w.clone().reshape(-1).float() for w in initial]
    velocity = [torch.zeros_like(w) for w in global_model]
    slices = {(key, index): span for key, w in enumerate(initial)
              for index, span in enumerate(slice_plan(w.numel(), SLICE_ELEMS))}
    schedule = LocalFrequencyAggregation(k2=k2, party_weight=1.0, fragments=fragments)  # only which rounds
    if fragments > 1:
        schedule.assign_fragments({sid: stop - start for sid, (start, stop) in slices.items()})
    in_flight: dict[tuple[int, int], tuple[int, torch.Tensor]] = {}
    inputs, targets = jobkit.make_data(steps, total)
    inputs = inputs.to(dtype)
    net = jobkit.make_model().to(dtype)
    for step in range(1, steps + 1):
        for party, ranks in ranks_of.items():
            grads = [torch.zeros_like(w) for w in models[party]]
            for rank in ranks:
                with torch.no_grad():
                    for p, w in zip(net.parameters(), models[party], strict=True):
                        p.copy_(w.reshape(p.shape))
                net.zero_grad()
                F.mse_loss(net(inputs[step - 1, rank]).float(), targets[step - 1, rank]).backward()
                grads = [g + p.grad.reshape(-1) for g, p in zip(grads, net.parameters(), strict=True)]
            mean = [g / len(ranks) for g in grads]
            if clip is not None:  # torch's clip_grad_norm_: scaled by max_norm / (norm + 1e-6), at most 1
                norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in mean]))
                mean = [g * torch.clamp(clip / (norm + 1e-6), max=1.0) for g in mean]
            models[party] = [torch.add(w, g, alpha=-lr) for w, g in zip(models[party], mean, strict=True)]
        if step % K1:
            continue
        count = step // K1
        for (key, index), (a, b) in slices.items():
            flight = in_flight.get((key, index))
            if flight is not None and flight[0] == count:  # an overlapped round lands: the mix
                del in_flight[(key, index)]
                global_model[key][a:b] = flight[1]
                for party in parties:
                    models[party][key][a:b] = (1 - alpha) * flight[1] + alpha * models[party][key][a:b].float()
            if not schedule.goes_global((key, index), count):
                continue
            delta = sum((models[p][key][a:b].float() - global_model[key][a:b]) * parties[p] / total for p in parties)
            if outer == "none":
                new = global_model[key][a:b] + delta
            else:  # Nesterov SGD on the gradient -delta, lr 0.7, momentum 0.9 (torch's formula)
                grad = -delta
                velocity[key][a:b] = 0.9 * velocity[key][a:b] + grad
                new = global_model[key][a:b] - 0.7 * (grad + 0.9 * velocity[key][a:b])
            if delay:
                in_flight[(key, index)] = (count + delay, new.clone())
            else:
                global_model[key][a:b] = new
                for party in parties:
                    models[party][key][a:b] = new
    assert not in_flight, "the simulation ends with every overlapped round landed"
    return ({party: [w.reshape(w0.shape) for w, w0 in zip(models[party], initial, strict=True)] for party in parties},
            [w.reshape(w0.shape) for w, w0 in zip(global_model, initial, strict=True)])


@pytest.mark.parametrize(("outer", "streaming"), [
    ("outer_nesterov", None),
    # 2 fragments of K2=4, each overlapping the next local round: fragment 0 leaves at rounds 2 and 6 and lands at
    # 3 and 7, fragment 1 leaves at 4, lands at 5; alpha 0.25, not 0.5: the mix swapped must not pass
    ("outer_nesterov", {"fragments": 2, "fragment_delay": 1, "fragment_alpha": 0.25}),
    # the same through the staged host mirror (the GPU's shape of the round machine: host buffers apart from the
    # model, copies on the copier thread), blocking: windows through staged buffers
    ("outer_nesterov", {"staged": True})],
    ids=["outer_nesterov", "streaming_overlapped", "staged_blocking"])
def test_hfa_in_collective_parties_matches_the_simulation(geomx_job, tmp_path, outer, streaming):
    """HFA (and DiLoCo's outer Nesterov) with DDP inside each collective party; a server party of one beside
    two collective parties weighs by its workers. Streaming: fragments on staggered rounds, their global rounds
    overlapping the next local round on every rank, then mixed with the party's model."""
    parties = {"dc0": 2, "dc1": 2, "dc2": 1}
    options = streaming or {}
    k2, steps = (4, 14) if "fragments" in options else (K2, 12)
    path = topology(tmp_path, {"dc0": "collective", "dc1": "collective"},
                    {"server_optimizer": outer, **(streaming or {})}, parties=parties, hfa={"k1": K1, "k2": k2},
                    slice_elems=SLICE_ELEMS, timeouts={"heartbeat_interval": "50ms"})
    job = geomx_job(SCRIPT, "--steps", str(steps), "--momentum", "0", topology=path)
    job.assert_ok()
    workers = job.workers()
    assert sorted(workers) == list(range(5)), "every worker reports"
    expected, _ = simulate_collective_hfa(workers[0][0]["after_init"], parties, outer, k2, steps,
                                       fragments=options.get("fragments", 1), delay=options.get("fragment_delay", 0),
                                       alpha=options.get("fragment_alpha", 0.0))
    party_of = [party for party, count in parties.items() for _ in range(count)]
    for rank, (tensors, report) in workers.items():
        assert report["mode"] == "HFA"
        for got, want in zip(tensors["final"], expected[party_of[rank]], strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=f"worker {rank}")
    if "fragments" not in options:  # after each global round every party holds the global model
        assert_model_digests_agree(job)
    if "fragments" in options:  # the last round mixed: the parties' models differ
        assert not torch.equal(workers[0][0]["final"][0], workers[4][0]["final"][0])


def test_gradients_averaged_before_the_step_can_be_clipped(geomx_job, tmp_path):
    """FSA with the optimizer on the workers, a collective party beside a server party: the script calls
    ``opt.average_gradients()`` after backward and clips the mean to norm 0.5 (the job's gradient norm is 0.7-1.1
    every step), and every rank ends with the weights of single-process SGD on the clipped mean."""
    clip = 0.5
    assert not torch.allclose(jobkit.reference_run(4, clip=clip)[1][0], jobkit.reference_run(4)[1][0]), "it clips"
    path = topology(tmp_path, {"dc0": "collective", "dc1": "server"}, slice_elems=512)
    job = geomx_job(SCRIPT, "--clip", str(clip), topology=path)
    job.assert_ok()
    workers = job.workers()
    assert {report["mode"] for _, report in workers.values()} == {"LOCAL"}
    jobkit.assert_fsa_equivalent(workers, num_workers=4, clip=clip)


def test_gradients_accumulate_inside_no_sync(geomx_job, tmp_path):
    """Each step's batch in two micro-batches, the first backward inside ``opt.no_sync()`` (the wrapper's, no DDP):
    nothing leaves until the second backward, which sends the sum, in a collective party and a server party alike.
    Every rank ends with single-process SGD's weights on the whole batches, the optimizer on the workers (on the
    global servers: the mixed-parties case of the first test)."""
    path = topology(tmp_path, {"dc0": "collective", "dc1": "server"}, {"server_optimizer": "auto"}, slice_elems=512)
    job = geomx_job(SCRIPT, "--accumulate", "2", topology=path)
    job.assert_ok()
    workers = job.workers()
    assert {report["mode"] for _, report in workers.values()} == {"LOCAL"}
    jobkit.assert_fsa_equivalent(workers, num_workers=4)


def test_a_collective_partys_mean_gradient_can_be_clipped_under_hfa(geomx_job, tmp_path):
    """HFA + outer Nesterov in two collective parties: ``opt.average_gradients()`` makes the party's mean (its
    all-reduce) before the step, the script clips it to norm 0.5, and the ranks end on the simulation's weights
    with each party's mean clipped so (which differ from the unclipped ones). Each step's batch comes in two
    micro-batches, the first inside ``opt.no_sync()``."""
    parties, clip = {"dc0": 2, "dc1": 2}, 0.5
    path = topology(tmp_path, {"dc0": "collective", "dc1": "collective"}, {"server_optimizer": "outer_nesterov"},
                    parties=parties, hfa={"k1": K1, "k2": K2}, slice_elems=SLICE_ELEMS)
    job = geomx_job(SCRIPT, "--steps", "12", "--momentum", "0", "--clip", str(clip), "--accumulate", "2",
                    topology=path)
    job.assert_ok()
    workers = job.workers()
    initial = workers[0][0]["after_init"]
    clipped, _ = simulate_collective_hfa(initial, parties, "outer_nesterov", clip=clip)
    plain, _ = simulate_collective_hfa(initial, parties, "outer_nesterov")
    assert not torch.allclose(clipped["dc1"][0], plain["dc1"][0], rtol=1e-3, atol=1e-4), "the test tells them apart"
    for rank, (tensors, report) in workers.items():
        assert report["mode"] == "HFA"
        for got, want in zip(tensors["final"], clipped["dc0" if rank < 2 else "dc1"], strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=f"worker {rank}")


def test_a_scripts_own_ddp_under_fsa_communicates_nothing_and_trains_as_single_process_sgd(geomx_job, tmp_path):
    """A torchrun script that wraps its model in DDP keeps it: under FSA geomx's reduce-scatter, WAN round and
    all-gather are the party's average, and DDP's all-reduce gives way to a comm hook that leaves its buckets as
    they are (DDP's own logging names it). The script accumulates each step's gradient over two micro-batches,
    the first backward inside ``ddp.no_sync()``: geomx pushes on the last one, as DDP would all-reduce. Every rank
    ends with the weights of single-process SGD on the whole batches."""
    path = topology(tmp_path, {"dc0": "collective", "dc1": "collective"}, {"bucket_mb": 0.001}, slice_elems=512)
    job = geomx_job(SCRIPT, "--ddp", "--accumulate", "2", topology=path)
    job.assert_ok()
    workers = job.workers()
    assert {report["ddp_comm_hook"] for _, report in workers.values()} == {"gradients_stay_local"}
    assert {report["mode"] for _, report in workers.values()} == {"LOCAL"}
    jobkit.assert_fsa_equivalent(workers, num_workers=4)


def test_a_scripts_own_ddp_under_hfa_makes_the_inner_steps(geomx_job, tmp_path):
    """Under HFA + outer Nesterov the script's DDP averages the party's gradients every step, with its own comm
    hook if it has one (here the script's, which sums where DDP averages), and geomx adds the global rounds only:
    every rank ends with the simulation's weights at twice the learning rate. geomx averaging as well (or instead)
    would give the mean's weights, which differ. Each step accumulates two micro-batches under ``no_sync()``."""
    parties = {"dc0": 2, "dc1": 2}
    path = topology(tmp_path, {"dc0": "collective", "dc1": "collective"}, {"server_optimizer": "outer_nesterov"},
                    parties=parties, hfa={"k1": K1, "k2": K2}, slice_elems=SLICE_ELEMS)
    job = geomx_job(SCRIPT, "--steps", "12", "--momentum", "0", "--ddp", "--ddp-sums", "--accumulate", "2",
                    topology=path)
    job.assert_ok()
    workers = job.workers()
    assert sorted(workers) == list(range(4)), "every worker reports"
    initial = workers[0][0]["after_init"]
    summed, _ = simulate_collective_hfa(initial, parties, "outer_nesterov", lr=2 * jobkit.LR)
    mean, _ = simulate_collective_hfa(initial, parties, "outer_nesterov")
    assert not torch.allclose(summed["dc1"][0], mean["dc1"][0], rtol=1e-3, atol=1e-4), "the test tells them apart"
    for rank, (tensors, report) in workers.items():
        assert report["mode"] == "HFA" and report["ddp_comm_hook"] == "sum_hook"
        for got, want in zip(tensors["final"], summed["dc0" if rank < 2 else "dc1"], strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=f"worker {rank}")


def test_a_party_that_starts_from_the_masters_weights_is_not_sent_them(geomx_job, tmp_path):
    """Every worker seeded alike (as a script seeded once is): the far party's INITs carry the digest of what its
    ranks hold, the global server answers them without the values, and the job is the one it was (the simulation
    of blocking HFA); seeded apart, the values come as before. The far party's WAN bytes received differ by the
    model's bytes (about: INIT answers' headers stay)."""
    parties = {"dc0": 2, "dc1": 2}
    received = {}
    for same in (True, False):
        path = topology(tmp_path / str(same), {"dc0": "collective", "dc1": "collective"}, {}, parties=parties,
                        hfa={"k1": K1, "k2": K2}, slice_elems=SLICE_ELEMS)
        job = geomx_job(SCRIPT, "--steps", "8", "--momentum", "0", *(["--same-seed"] if same else []),
                        topology=path, name=f"same{same}")
        job.assert_ok()
        workers = job.workers()
        expected, _ = simulate_collective_hfa(workers[0][0]["after_init"], parties, "none", K2, 8)
        party_of = [party for party, count in parties.items() for _ in range(count)]
        for rank, (tensors, _) in workers.items():
            for got, want in zip(tensors["final"], expected[party_of[rank]], strict=True):
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=f"worker {rank}, same seed {same}")
        received[same] = sum(entry["wan"]["recv"] for entry in read_stats(job.run_dir)
                             if entry.get("party") == "dc1" and entry.get("role") == "worker")
        model_bytes = sum(t.numel() * 4 for t in workers[0][0]["after_init"])
    assert received[False] - received[True] > 0.9 * model_bytes, (received, model_bytes)


def run_under_torchrun(tmp_path: Path, path: Path, *args: str) -> tuple[Any, str, list[Any], list[str], Path]:
    """`geomx launch --global-only` in a thread, and each party as `python -m torch.distributed.run` with
    GEOMX_TOPOLOGY, GEOMX_PARTY and GEOMX_GLOBAL_SCHEDULER: (the tier's result, its output, the parties'
    processes, their outputs, the run folder)."""
    import os
    import subprocess
    import sys
    import threading

    from harness import WORKERS_DIR, TierOutput

    from geomx.config import load_topology
    from geomx.launch import free_port, launch

    address = f"127.0.0.1:{free_port()}"
    run_dir = tmp_path / "run"
    out = TierOutput()
    results: list[Any] = []
    listening = out.listening  # set once the tier says it listens, or once it has ended

    def run_tier() -> None:
        try:
            results.append(launch(path, [], run_dir=run_dir, out=out, global_scheduler=address, global_only=True))
        finally:
            listening.set()

    tier = threading.Thread(target=run_tier)
    tier.start()
    # the parties start once the tier's scheduler listens (what an operator waits for, reading the same line): on a
    # loaded machine the tier's start can take longer than a rank's registration timeout
    assert listening.wait(timeout=120) and tier.is_alive(), f"the global tier did not listen: {out.getvalue()}"
    env = {**os.environ, "GEOMX_TOPOLOGY": str(path), "GEOMX_GLOBAL_SCHEDULER": address,
           "GEOMX_RUN_DIR": str(run_dir)}
    parties = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                 f"--nproc-per-node={party.num_workers}", str(WORKERS_DIR / SCRIPT), *args],
                                env={**env, "GEOMX_PARTY": party.name}, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)
               for party in load_topology(path).parties]
    outputs = [proc.communicate(timeout=240)[0].decode(errors="replace") for proc in parties]
    tier.join(timeout=120)
    assert not tier.is_alive(), "the global tier did not stop"
    return results[0], out.getvalue(), parties, outputs, run_dir


def test_collective_parties_under_their_own_torchrun_join_a_global_only_tier(tmp_path):
    """The multi-host form on one machine: `geomx launch --global-only` runs the global tier, and each party is a
    plain `python -m torch.distributed.run` with GEOMX_TOPOLOGY, GEOMX_PARTY and GEOMX_GLOBAL_SCHEDULER set."""
    path = topology(tmp_path, {"dc0": "collective", "dc1": "collective"}, parties={"dc0": 2, "dc1": 1},
                    slice_elems=512)
    result, output, parties, outputs, run_dir = run_under_torchrun(tmp_path, path)
    assert [proc.returncode for proc in parties] == [0, 0], "\n".join(o[-3000:] for o in outputs)
    assert result.exit_code == 0, output[-3000:]
    assert "the global tier listens at 127.0.0.1:" in output
    jobkit.assert_fsa_equivalent(jobkit.load_worker_outputs(run_dir), num_workers=3)


def test_a_dead_rank_stops_the_job_naming_it(tmp_path):
    """A rank of dc0 dies mid-training (torchrun then stops its party): the global tier notices its heartbeats
    stop, and FSA, which needs every party, fails the other party's round naming the dead rank, within the
    heartbeat timeout. No process hangs."""
    path = topology(tmp_path, {"dc0": "collective", "dc1": "collective"}, parties={"dc0": 2, "dc1": 1},
                    slice_elems=512, timeouts={"heartbeat": "3s", "heartbeat_interval": "0.5s"})
    result, _, parties, outputs, _ = run_under_torchrun(tmp_path, path, "--die-rank", "1", "--die-step", "3")
    assert parties[0].returncode != 0 and parties[1].returncode != 0, "\n".join(o[-2000:] for o in outputs)
    assert result.exit_code != 0
    # the dead rank, or its peer torchrun stopped a moment later: whichever's heartbeats the scheduler missed first
    assert re.search(r"dc0/worker[01] of dc0/ranks is dead", outputs[1]), outputs[1][-3000:]


def test_a_hung_rank_stops_its_party_within_the_round_timeout_under_the_scripts_own_group(geomx_job, tmp_path):
    """A rank of dc0 hangs mid-training (alive, its sockets open) in a script that initialized its own process group
    (torch's default timeout: 30 minutes for gloo) and wrapped its model in DDP, whose all-reduce is HFA's inner
    step. The wrapper bounds the script's group by the topology's round timeout, so the hung rank's peer fails its
    all-reduce within it, naming the timeout. (Unbounded, it would wait 30 minutes; the job still stops here because
    the other party's global round times out as well, and the launcher stops every process.)"""
    path = topology(tmp_path, {"dc0": "collective", "dc1": "collective"}, {"server_optimizer": "outer_nesterov"},
                    hfa={"k1": K1, "k2": K2}, slice_elems=SLICE_ELEMS, timeouts={"round": "5s"})
    job = geomx_job(SCRIPT, "--steps", "12", "--ddp", "--hang-rank", "1", "--hang-step", "3", topology=path)
    assert job.result.exit_code != 0, job.tail()
    assert job.result.wall_s < 100, job.result.wall_s
    peer = "\n".join(line for line in job.output.splitlines() if line.startswith("[dc0/worker0]"))
    assert re.search(r"[Tt]imed out|[Tt]imeout", peer), peer[-3000:]


def test_a_wan_codec_in_collective_parties_encodes_each_owned_slice(geomx_job, tmp_path):
    """Each rank encodes the slices it owns (int8's residuals stay with their owner): FSA still ends near the
    dense reference, every rank holds the same bits, and the WAN carries a fraction of the dense bytes. (fp16, a
    stateless codec, takes the same path without residuals.)"""
    codec, max_fraction = {"type": "error_feedback", "inner": {"type": "int8"}}, 0.45
    path = topology(tmp_path, {"dc0": "collective", "dc1": "collective"}, {"compression": codec}, slice_elems=512)
    job = geomx_job(SCRIPT, topology=path)
    job.assert_ok()
    workers = job.workers()
    assert sorted(workers) == [0, 1, 2, 3]
    _, reference = jobkit.reference_run(4, jobkit.STEPS)
    for rank, (tensors, _) in workers.items():
        for got, want, same in zip(tensors["final"], reference, workers[0][0]["final"], strict=True):
            assert torch.equal(got, same), f"rank {rank} differs from rank 0"
            torch.testing.assert_close(got, want, rtol=0.05, atol=0.02)
    # dense: dc1's model up and the answer down each step, plus init (dc0 shares its host with the global server)
    dense = (jobkit.STEPS + 1) * 2 * jobkit.param_bytes()
    assert job.summary["wan_bytes"] <= max_fraction * dense, (job.summary["wan_bytes"], dense)


def test_bisparse_under_hfa_in_collective_parties_answers_with_compressed_model_changes(geomx_job, tmp_path):
    """HFA with Bi-Sparse (keeping 25%) in two collective parties: each owner pushes its slices' sparse deltas and
    the global servers answer with the global model's change, compressed; the owner adds it to the slice's last
    global model. Every rank of the job ends with the same global model (what the answers built), near the dense
    simulation's, and the WAN carries a fraction of the dense bytes. Read as the model itself, a change would
    leave the ranks near zero, far from the simulation."""
    bisparse_hfa_job(geomx_job, tmp_path)


def bisparse_hfa_job(geomx_job: Any, tmp_path: Path, *args: str) -> None:
    """The Bi-Sparse HFA job and its checks (``args``: more of the worker's, e.g. ``--device cuda``)."""
    parties = {"dc0": 2, "dc1": 2}
    path = topology(tmp_path, {"dc0": "collective", "dc1": "collective"},
                    {"server_optimizer": "none", "compression": {"type": "bsc", "threshold": 0.25,
                                                                 "size_lower_bound": 0}},
                    parties=parties, hfa={"k1": K1, "k2": K2}, slice_elems=SLICE_ELEMS)
    job = geomx_job(SCRIPT, "--steps", "12", "--momentum", "0", *args, topology=path)
    job.assert_ok()
    workers = job.workers()
    assert sorted(workers) == [0, 1, 2, 3]
    for rank in (1, 3):  # a party's ranks: one model
        assert all(torch.equal(a, b) for a, b in zip(workers[rank][0]["final"], workers[rank - 1][0]["final"],
                                                     strict=True)), rank
    _, dense_global = simulate_collective_hfa(workers[0][0]["after_init"], parties, "none", K2, 12)
    for index in range(len(dense_global)):  # the last step is a global round: every party holds its model
        assert torch.equal(workers[0][0]["final"][index], workers[2][0]["final"][index]), index
    got, want = (torch.cat([t.reshape(-1) for t in model]) for model in (workers[0][0]["final"], dense_global))
    error = torch.linalg.norm(got - want) / torch.linalg.norm(want)
    assert error < 0.1, float(error)  # seen: 0.03 (the change taken for the model: 1.0)
    dense = (12 // (K1 * K2) + 1) * 2 * jobkit.param_bytes()  # dc1's model up and down each round, plus init
    assert job.summary["wan_bytes"] <= 0.8 * dense, (job.summary["wan_bytes"], dense)


def test_a_collective_party_sends_the_wan_bytes_of_a_server_party_spread_over_its_ranks(geomx_job, tmp_path,
                                                                                       monkeypatch):
    """The same FSA job with every party's LAN tier a local server, then a collective group: each party's WAN
    bytes within 2% (and a bundle's own header and body, under 128 bytes, for each bundle a rank sent), and a
    collective party's ranks each carry their share over their own connection. Early answers off in both: a local
    server gets the others' sum ahead and then a tensor-less answer, one more header per slice that a collective
    party, not one connection, never gets (6% more WAN bytes at 128-element slices)."""
    from geomx.transport.trace import read_trace

    jobs = {}
    for lan in ("server", "collective"):
        monkeypatch.setenv("GEOMX_TRACE", "1" if lan == "collective" else "0")
        path = topology(tmp_path / lan, {"dc0": lan, "dc1": lan}, top={"early_answers": False}, slice_elems=128)
        jobs[lan] = geomx_job(SCRIPT, topology=path, name=lan)
        jobs[lan].assert_ok()
    # the rounds' bytes (the heartbeats' grow with each job's wall time, which the machine's load sets)
    server, collective = ({party: sum(link["sent"] for link in links_to_global_servers(read_stats(jobs[lan].run_dir),
                                                                                      party))
                           for party in ("dc0", "dc1")} for lan in ("server", "collective"))
    events = read_trace([jobs["collective"].run_dir])
    for party in ("dc0", "dc1"):
        bundles = sum(1 for e in events if e["node"].startswith(f"{party}/") and e["event"] == "queue"
                      and e["kind"] == "BUNDLE" and not e["reply"])
        assert bundles >= jobkit.STEPS, (party, bundles)
        allowed = 0.02 * server[party] + 128 * bundles
        assert abs(collective[party] - server[party]) <= allowed, (party, bundles, server, collective)
    ranks = {entry["name"]: entry["wan"]["sent"] for entry in read_stats(jobs["collective"].run_dir)
             if entry.get("party") == "dc1" and entry.get("role") == "worker"}
    assert len(ranks) == 2 and min(ranks.values()) > 0.9 * max(ranks.values()), ranks  # balanced within 10%
    from geomx.launch import format_summary

    assert {name: sent for name, sent in jobs["collective"].summary["wan_bytes_sent_by_process"].items()
            if name.startswith("dc1/")} == ranks
    assert "WAN streams   : dc1 2 (worker0 " in format_summary(jobs["collective"].result)


def test_fsdp_in_collective_parties_trains_as_the_same_job_without_it(geomx_job, tmp_path):
    """Streaming DiLoCo (HFA K1=2 K2=4, outer Nesterov, 2 fragments, each global round overlapping the next local
    round, alpha 0.25) over 2 collective parties x 2 ranks, the model sharded by FSDP2 (fully_shard per layer and
    on the root; uneven rows, 384-element slices across the shards' boundaries) or not: the same weights on every
    rank after init and after 14 steps, the same job's model (``load_job_model``, into a model sharded alike), and
    the same WAN bytes. Under FSDP2 each rank syncs the slices it owns from the shards; nobody gathers the model (the
    script does, to save it). The FSDP2 job's rounds go through the staged host mirror (the GPU's shape: host
    buffers apart from the chunk, copies on the copier thread). (In bfloat16, in place: ``test_bf16.py``.)"""
    fsdp_matches_the_job_without_it(geomx_job, tmp_path, "float32", staged=True)


@pytest.mark.parametrize(("server_optimizer", "mode"), [("auto", "LOCAL"), ("translate", "SERVER")],
                         ids=["sgd-on-every-rank", "sgd-on-the-servers"])
def test_fsa_with_fsdp_in_collective_parties_equals_single_process_sgd(geomx_job, tmp_path, server_optimizer, mode):
    """FSA over 2 collective parties x 2 ranks whose model FSDP2 shards (fully_shard per layer and on the root;
    384-element slices across the shards' boundaries): every rank holds the weights of one process training on all
    four ranks' batches. Each rank pushes the party's sum of the gradient slices it owns, from its shards (FSDP2
    reduce-scattered and averaged them in backward), and the answers go back into the shards: the gradients' global
    sum for the optimizer on every rank, or the servers' new weights."""
    fsdp_fsa_job(geomx_job, tmp_path, server_optimizer, mode)


def fsdp_fsa_job(geomx_job, tmp_path: Path, server_optimizer: str, mode: str, *args: str, **tolerance: float) -> None:
    """The FSA + FSDP2 test's job (the script's ``args`` added) and its checks, to ``tolerance`` (assert_close's)."""
    steps = 8
    path = topology(tmp_path, {"dc0": "collective", "dc1": "collective"}, {"server_optimizer": server_optimizer},
                    parties={"dc0": 2, "dc1": 2}, slice_elems=384)
    job = geomx_job("fsdp_train.py", "--steps", str(steps), "--fsdp", *args, topology=path)
    job.assert_ok()
    workers = job.workers()
    assert sorted(workers) == list(range(4)), "every worker reports"
    initial, final = jobkit.reference_run(4, steps, momentum=0.0)  # fsdp_train.py: plain SGD at jobkit.LR
    for rank, (tensors, report) in workers.items():
        assert report["mode"] == mode and report["fsdp"] and report["trained_steps"] == steps, report
        for name, want in (("after_init", initial), ("final", final), ("job", final)):
            for index, (got, expected) in enumerate(zip(tensors[name], want, strict=True)):
                torch.testing.assert_close(got, expected, **tolerance,
                                           msg=lambda m, r=rank, n=name, i=index: f"worker {r} {n} {i}: {m}")


def fsdp_matches_the_job_without_it(geomx_job, tmp_path: Path, dtype: str, *args: str,
                                    staged: bool = False) -> None:
    """The FSDP2 test's two jobs, with the model in ``dtype`` (the script's ``args`` added), and their checks;
    ``staged``: the FSDP2 job's rounds through the staged host mirror (the job without it runs in place)."""
    parties, steps, k2 = {"dc0": 2, "dc1": 2}, 14, 4
    streaming = {"fragments": 2, "fragment_delay": 1, "fragment_alpha": 0.25}
    workers, wan = {}, {}
    for fsdp in (False, True):
        name = "fsdp" if fsdp else "ddp"
        mirror = {"staged": True} if fsdp and staged else {}
        path = topology(tmp_path / name, {"dc0": "collective", "dc1": "collective"},
                        {"server_optimizer": "outer_nesterov", **streaming, **mirror}, parties=parties,
                        hfa={"k1": K1, "k2": k2}, slice_elems=384)
        job = geomx_job("fsdp_train.py", "--steps", str(steps), "--dtype", dtype, *(["--fsdp"] if fsdp else []),
                        *args, topology=path, name=name)
        job.assert_ok()
        # the rounds' bytes, both ways (the heartbeats' grow with each job's wall time, which the machine's load sets)
        workers[fsdp] = job.workers()
        wan[fsdp] = sum(link["sent"] + link["recv"] for link in links_to_global_servers(read_stats(job.run_dir)))
        assert sorted(workers[fsdp]) == list(range(4)), "every worker reports"
    assert abs(wan[True] - wan[False]) <= 0.02 * wan[False], wan
    for rank, (tensors, report) in workers[True].items():  # the DDP form itself: the simulation's, tested above
        assert report["mode"] == "HFA" and report["fsdp"]
        plain = workers[False][rank][0]
        for name in ("after_init", "final", "job"):
            for got, want in zip(tensors[name], plain[name], strict=True):
                assert got.dtype == getattr(torch, dtype)
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=f"worker {rank} {name}")
        assert not all(torch.equal(a, b) for a, b in zip(tensors["job"], tensors["final"], strict=True))


def test_collective_parties_with_two_global_servers_p3_a_secret_and_checkpoints(geomx_job, tmp_path):
    """The operations a server party has, in collective parties, on one job: slices spread over two global
    servers (each rank's owned slices go to whichever holds them), P3 (small slices, shallow layers first; the
    optimizer on the servers), a shared secret on every connection, and checkpoints every 2 steps. Still
    single-process SGD's weights; every global server writes its checkpoints, and ``--resume`` starts every rank
    from the newest."""
    path = topology(tmp_path, {"dc0": "collective", "dc1": "collective"}, {"p3": True},
                    top={"security": {"secret": "collective-secret"},
                         "checkpoint": {"dir": str(tmp_path / "ckpt"), "every_steps": 2}},
                    slice_elems=512, global_servers=2)
    job = geomx_job(SCRIPT, topology=path)
    job.assert_ok()
    workers = job.workers()
    assert {report["mode"] for _, report in workers.values()} == {"SERVER"}
    jobkit.assert_fsa_equivalent(workers, num_workers=4)
    for shard in ("gs0", "gs1"):
        assert sorted((tmp_path / "ckpt" / shard).glob("*.json")), f"{shard} wrote no checkpoint"
    # geomx launch --resume: every rank of both collective parties starts from the newest checkpoint's model
    latest = [load_latest(tmp_path / "ckpt", shard) for shard in (0, 1)]
    assert all(snapshot is not None and snapshot.step == 4 for snapshot in latest), latest
    resumed = geomx_job(SCRIPT, "--steps", "2", name="resumed", topology=path, resume=True)
    resumed.assert_ok()
    assert "resumed from" in resumed.output, resumed.tail()
    checkpointed = {sid: values for snapshot in latest for sid, values in snapshot.values.items()}
    for rank, (tensors, _) in resumed.workers().items():
        for key, got in enumerate(tensors["after_init"]):
            parts = sorted((index, values) for (k, index), values in checkpointed.items() if k == key)
            want = torch.from_numpy(np.concatenate([values for _, values in parts])).reshape(got.shape)
            assert torch.equal(got, want), f"rank {rank} key {key} did not start from the checkpoint"
