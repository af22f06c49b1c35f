"""Integration worker for HFA: local SGD steps, and every K1 steps push param / num_local_workers and pull.

This is GeoMX's cnn_hfa.py loop on jobkit's model and data. The master may install an outer optimizer and a WAN codec
(``--compression``, JSON). ``--batch`` (JSON, party -> batch size, the first samples of jobkit's batch): each push
reports its worker's samples since its last one, as decoupled rounds weigh the parties by them.
Saves initial and final weights to $GEOMX_RUN_DIR/out/worker<global rank>.*
"""

from __future__ import annotations

import argparse
import json
import time

import jobkit
import torch
import torch.nn.functional as F

import geomx


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--outer", choices=["none", "outer_nesterov"], default="none")
    parser.add_argument("--compression", default="null", help="JSON codec spec, or null for dense")
    parser.add_argument("--batch", default="{}", help="JSON: party -> batch size of its workers (reported as tokens)")
    parser.add_argument("--sleep", default="{}", help="JSON: party -> seconds each of its workers sleeps a step")
    parser.add_argument("--party-steps", default="{}", help="JSON: party -> its steps, in place of --steps")
    parser.add_argument("--after", default="{}",
                        help="JSON: party -> global ranks whose outputs its workers wait for before their first step")
    args = parser.parse_args()
    spec = json.loads(args.compression)
    kv = geomx.kv.create("dist_sync")
    assert kv.hfa is not None, "run with hfa in the topology (or MXNET_KVSTORE_USE_HFA=1)"
    rank = kv.global_rank
    torch.manual_seed(jobkit.seed_for(rank))
    model = jobkit.make_model()
    params = list(model.parameters())
    if kv.is_master_worker and spec is not None:
        kv.set_gradient_compression(spec)
    if kv.is_master_worker and args.outer != "none":
        kv.set_optimizer(geomx.optim.OuterNesterov())
    kv.init(list(range(len(params))), [p.data for p in params])
    initial = [p.detach().clone() for p in params]
    local = torch.optim.SGD(params, lr=jobkit.LR)
    steps = json.loads(args.party_steps).get(kv.party, args.steps)
    inputs, targets = jobkit.make_data(steps, kv.num_all_workers)
    batch = json.loads(args.batch).get(kv.party)
    tokens = None if batch is None else batch * kv.hfa.k1  # the samples since this worker's last push
    pause = json.loads(args.sleep).get(kv.party, 0.0)
    for other in json.loads(args.after).get(kv.party, []):
        wait_for_output(kv.config.run_dir, other)
    started = time.monotonic()
    for step in range(1, steps + 1):
        time.sleep(pause)
        local.zero_grad()
        F.mse_loss(model(inputs[step - 1, rank, :batch]), targets[step - 1, rank, :batch]).backward()
        local.step()
        if step % kv.hfa.k1 == 0:
            for idx, param in enumerate(params):
                kv.push(idx, param.data / kv.num_workers, priority=-idx, tokens=tokens)
            for idx, param in enumerate(params):
                kv.pull(idx, param.data, priority=-idx)
    loop_s = time.monotonic() - started
    job_model = [torch.empty_like(p) for p in params]  # the job's model as the party's local server holds it
    kv.pull_job_model(list(range(len(params))), job_model)
    jobkit.save_worker_output(kv.config.run_dir, rank, {"initial": initial,
                                                        "final": [p.detach().clone() for p in params],
                                                        "job_model": job_model},
                              {"party": kv.party, "num_workers": kv.num_workers, "loop_s": loop_s})
    kv.close()


def wait_for_output(run_dir, rank: int, timeout: float = 60.0) -> None:
    """Until worker ``rank`` has saved its outputs (its loop and its job model's pull are done)."""
    path = jobkit.out_dir(run_dir) / f"worker{rank}.json"
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{path} did not appear within {timeout} s")
        time.sleep(0.05)


if __name__ == "__main__":
    jobkit.run_and_exit(main)
