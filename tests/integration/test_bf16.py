"""A model in bfloat16 (a large language model's usual weights), in both kinds of party: its values travel widened
to float32, the servers sum and step in float32, and what lands is rounded to bfloat16 (``geomx.protocol.tensors``).

The FSA tests replay every step exactly: from the gradients each rank's backward made (bfloat16) and the weights
it held, the single-process arithmetic of the tiers (a server party's local server sums in float32; a collective
party's reduce-scatter sums in bfloat16, as DDP's all-reduce of a bfloat16 model does; the global server sums the
parties in float32; the sum lands rounded to bfloat16, every rank averages and steps; or the servers step their
float32 model, which lands rounded) gives every rank's weights after the step, bit for bit. The HFA tests hold the
job to the single-process simulation run in bfloat16 (its global model float32), within a rounding or two."""

from __future__ import annotations

import jobkit
import numpy as np
import pytest
import torch
from harness import write_topology

from geomx.bench.quality import sent_to_global_servers
from geomx.runs.runlog import read_stats

SCRIPT = "frontend_train.py"
STEPS = 6
PARTIES = {"dc0": (0, 1), "dc1": (2, 3)}  # global ranks


def party_sum(grads: list[torch.Tensor], rounded: bool) -> torch.Tensor:
    """A party's sum of its ranks' bfloat16 gradients as it reaches the global server, in float32: a local server
    adds the float32 values; a collective party's reduce-scatter adds in bfloat16 (``rounded``: one rounding, the
    float32 sum of two bfloat16 values being exact), as does the bf16 codec on the way up."""
    total = grads[0].float() + grads[1].float()
    return total.bfloat16().float() if rounded else total


def run_and_replay(geomx_job, tmp_path, lan: dict[str, str], compression: str | None, servers_step: bool = False,
                   *args: str, mixed: bool = False) -> None:
    """FSA with SGD on every rank (``servers_step``: on the global servers, their float32 copy of the model stepped
    and rounded as it lands) and a bfloat16 model, replayed step by step (module docstring), and the far party's
    WAN bytes where they go as bfloat16's bits.
    ``args``: the worker's own (``--device cuda``); ``mixed``: the model's last layer float32 (a collective party's
    buckets are then float32: its sums are not rounded, and the float32 layer's arithmetic is float32 throughout)."""
    training = {"server_optimizer": "translate" if servers_step else "auto",
                **({"compression": {"type": compression}} if compression else {})}
    path = write_topology(tmp_path / f"{compression}-{servers_step}" / "job.yaml", lan=lan, slice_elems=512,
                          training=training)
    job = geomx_job(SCRIPT, "--dtype", "bfloat16", "--momentum", "0", "--record", "--steps", str(STEPS), *args,
                    *(["--float32-head"] if mixed else []), topology=path, name=f"{compression}-{servers_step}")
    job.assert_ok()
    workers = job.workers()
    assert sorted(workers) == [0, 1, 2, 3]
    keys = len(workers[0][0]["final"])
    dtypes = [t.dtype for t in workers[0][0]["final"]]
    assert dtypes == [torch.bfloat16] * 2 + [torch.float32 if mixed else torch.bfloat16] * 2, dtypes
    assert {report["mode"] for _, report in workers.values()} == {"SERVER" if servers_step else "LOCAL"}
    for tensors, _ in workers.values():  # INIT: the master's model on every rank
        assert all(torch.equal(a, b) for a, b in zip(tensors["after_init"], workers[0][0]["after_init"], strict=True))
    master = [w.float() for w in workers[0][0]["after_init"]]  # the global servers' model: float32
    for step in range(STEPS):
        for key in range(keys):
            at = step * keys + key
            held = workers[0][0]["held"][at]  # every rank's (checked after the step before, or at INIT)
            total = sum(party_sum([workers[r][0]["local"][at] for r in ranks],
                                  (lan.get(party) == "collective" and not mixed) or compression == "bf16")
                        for party, ranks in PARTIES.items())
            if servers_step:  # the servers average and step their float32 model (geomx.optim.SGD's NumPy arithmetic:
                # the product rounded, then the sum), and it lands rounded
                weights = master[key].numpy().copy()
                weights += (total.numpy() * np.float32(1 / 4)) * np.float32(-jobkit.LR)
                master[key] = torch.from_numpy(weights)
                param = master[key].to(held.dtype)
            else:  # the sum lands rounded, every rank averages it in the model's dtype and steps
                param = torch.nn.Parameter(held.clone())
                param.grad = total.to(held.dtype) * (1.0 / 4)
                torch.optim.SGD([param], lr=jobkit.LR).step()
            for rank, (tensors, _) in workers.items():  # what it trains on next (a server party's step lands the
                # servers' weights before the next forward); after the last step, its final weights
                after = tensors["held"][at + keys] if step + 1 < STEPS else tensors["final"][key]
                assert torch.equal(after, param.detach()), f"rank {rank} after step {step}, key {key}"
    moved = sum(int((a != b).sum()) for a, b in zip(workers[0][0]["after_init"], workers[0][0]["final"], strict=True))
    assert moved > 0, "the job trained"
    if (lan.get("dc1") == "collective") != (compression is not None):  # bfloat16's bits: a collective party's own
        # pushes (exact), or every push under the bf16 codec: at most 60% of float32's bytes
        pushed = sum(t.numel() for t in workers[0][0]["final"]) * STEPS * 4  # the same pushes in float32
        # what dc1 sent the global servers: not its heartbeats to the global scheduler, which grow with wall time
        to_servers = sent_to_global_servers(read_stats(job.run_dir)).get("dc1", 0)
        assert 0 < to_servers < 0.6 * pushed, (to_servers, pushed, job.summary)


# Mixed parties with SGD on every rank: the next test's job (its float32 last layer beside the bfloat16 ones)
@pytest.mark.parametrize(("lan", "servers_step"), [
    ({"dc0": "collective", "dc1": "collective"}, False),
    ({"dc0": "collective", "dc1": "server"}, True)],
    ids=["two-collective-parties-sgd-on-every-rank", "mixed-parties-sgd-on-the-servers"])
def test_fsa_of_a_bfloat16_model_replays_the_tiers_arithmetic_bit_for_bit(geomx_job, tmp_path, lan, servers_step):
    """FSA, a bfloat16 model: each step's weights equal, on every rank, the held weights minus lr x (the parties'
    float32 sum, rounded to bfloat16) / 4 (a collective party's ranks push their bfloat16 sums as bfloat16's bits,
    at most 60% of float32's bytes); with SGD on the servers, their float32 model (the bfloat16 values at
    INIT) minus lr x the float32 sum / 4, rounded to bfloat16. Without the widening the job fails at INIT (NumPy has
    no bfloat16); a tier that summed, stepped or answered in another precision would not replay."""
    run_and_replay(geomx_job, tmp_path, lan, compression=None, servers_step=servers_step)


def test_a_model_mixing_bfloat16_and_float32_keeps_its_float32_layer_exact(geomx_job, tmp_path):
    """bfloat16 layers and a float32 last layer (as a model keeps its norms in float32): a collective party's buckets
    take the wider dtype, so the float32 layer's sums are never rounded to bfloat16, and every step replays bit for
    bit (in a bucket of the first parameter's bfloat16 the float32 layer's would not)."""
    run_and_replay(geomx_job, tmp_path, {"dc0": "collective", "dc1": "server"}, None, mixed=True)


def test_the_bf16_codec_halves_the_wan_bytes_of_a_bfloat16_model_and_replays(geomx_job, tmp_path):
    """``compression: {type: bf16}``: the WAN carries bfloat16's bits both ways. The pushes of a bfloat16 model's
    ranks and the answers that land in it lose nothing to it, the server party's float32 sum is rounded on its
    way up, and the job still replays bit for bit; the far party's local server sends at most 60% of what its
    float32 sums would weigh (the messages' headers cross either way)."""
    run_and_replay(geomx_job, tmp_path, {"dc0": "collective", "dc1": "server"}, compression="bf16")


def test_fsdp2_of_a_bfloat16_model_trains_as_the_same_job_without_it(geomx_job, tmp_path):
    """Streaming DiLoCo over two collective parties, the bfloat16 model sharded by FSDP2 or not (the owned slices
    gathered from the shards, widened to float32 for the WAN): the same weights on every rank after init and at
    the end, the same job's model and WAN bytes (``test_collective``'s FSDP2 test, in bfloat16)."""
    from test_collective import fsdp_matches_the_job_without_it

    fsdp_matches_the_job_without_it(geomx_job, tmp_path, "bfloat16")


@pytest.mark.parametrize("streaming", [None, {"fragments": 2, "fragment_delay": 1, "fragment_alpha": 0.25}],
                         ids=["blocking", "streaming-overlapped-mixed"])
def test_hfa_of_a_bfloat16_model_matches_the_simulation_in_bfloat16(geomx_job, tmp_path, streaming):
    """HFA with DiLoCo's outer Nesterov over two collective parties (dc0 and dc1, two ranks each) and a server
    party of one, a bfloat16 model, blocking or streaming with overlapped, mixed fragments: every rank ends on
    the simulation's model when the simulation's parties step in bfloat16 and its global model is float32, within
    a bfloat16 rounding or two (the servers' float32 arithmetic is not the simulation's, operation for operation).
    The same job in float32 ends many roundings away (bfloat16 steps lose what is below their precision), so the
    check tells the two apart."""
    from test_collective import K1, SLICE_ELEMS, simulate_collective_hfa

    parties = {"dc0": 2, "dc1": 2, "dc2": 1}
    k2, steps = (4, 14) if streaming else (2, 12)
    options = streaming or {}
    path = write_topology(tmp_path / "job.yaml", parties=parties, lan={"dc0": "collective", "dc1": "collective"},
                          slice_elems=SLICE_ELEMS, hfa={"k1": K1, "k2": k2},
                          training={"server_optimizer": "outer_nesterov", **options})
    job = geomx_job(SCRIPT, "--dtype", "bfloat16", "--steps", str(steps), "--momentum", "0", topology=path)
    job.assert_ok()
    workers = job.workers()
    assert sorted(workers) == list(range(5)), "every worker reports"
    simulate = lambda dtype: simulate_collective_hfa(  # noqa: E731
        workers[0][0]["after_init"], parties, "outer_nesterov", k2, steps, fragments=options.get("fragments", 1),
        delay=options.get("fragment_delay", 0), alpha=options.get("fragment_alpha", 0.0), dtype=dtype)[0]
    expected, exact = simulate(torch.bfloat16), simulate(torch.float32)
    party_of = [party for party, count in parties.items() for _ in range(count)]
    far = worst = 0.0
    for rank, (tensors, report) in workers.items():
        assert report["mode"] == "HFA"
        for got, want, full in zip(tensors["final"], expected[party_of[rank]], exact[party_of[rank]], strict=True):
            assert got.dtype == torch.bfloat16 and torch.isfinite(got).all(), f"worker {rank}"
            ulp = torch.finfo(torch.bfloat16).eps * want.float().abs().clamp(min=2 ** -6)  # bfloat16's step there
            worst = max(worst, float(((got.float() - want.float()).abs() / ulp).max()))
            far = max(far, float(((got.float() - full).abs() / ulp).max()))
    assert worst <= 2, f"a rank ends {worst:.1f} bfloat16 steps from the simulation"
    assert far > 4, f"the float32 job ends {far:.1f} steps away: the check cannot tell bfloat16 from float32"
