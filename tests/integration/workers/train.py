"""Integration worker: the FSA push-all/pull-all loop on jobkit's model and data, plus optional faults.

Every worker saves its weights (before init, after init, final) and a JSON report into
``$GEOMX_RUN_DIR/out/worker<global rank>.{pt,json}``. Options pick which worker (by global rank) misbehaves.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jobkit
import torch
import torch.nn.functional as F

import geomx


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=jobkit.STEPS)
    parser.add_argument("--lr", type=float, default=jobkit.LR)
    parser.add_argument("--momentum", type=float, default=jobkit.MOMENTUM)
    parser.add_argument("--fault-step", type=int, default=2, help="the step at which faults are injected")
    parser.add_argument("--bad-requests-rank", type=int, default=-1)
    parser.add_argument("--fuzz-rank", type=int, default=-1)
    parser.add_argument("--fuzz-frames", type=int, default=3000)
    parser.add_argument("--poison-rank", type=int, default=-1, help="send one deeply nested JSON body")
    parser.add_argument("--forge-rank", type=int, default=-1, help="forge ERROR replies to the local server")
    parser.add_argument("--die-rank", type=int, default=-1, help="os._exit(3) at the fault step")
    parser.add_argument("--raise-rank", type=int, default=-1, help="raise an exception at the fault step")
    parser.add_argument("--bogus-create", action="store_true", help="first try kv.create('dist_bogus')")
    parser.add_argument("--kind", default="dist_sync", help="kvstore type")
    parser.add_argument("--dcasgd", action="store_true", help="DCASGD instead of SGD on the global server")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    report: dict = {}
    if args.bogus_create:
        try:
            geomx.kv.create("dist_bogus")
            report["bogus_create"] = {"outcome": "no error", "text": ""}
        except Exception as exc:
            report["bogus_create"] = {"outcome": type(exc).__name__, "text": str(exc)}
    kv = geomx.kv.create(args.kind)
    rank = kv.global_rank
    report.update(name=kv.name, global_rank=rank, rank=kv.rank, party=kv.party, num_workers=kv.num_workers,
                  num_all_workers=kv.num_all_workers, is_master_worker=kv.is_master_worker)
    torch.manual_seed(jobkit.seed_for(rank))  # deliberately different per worker; init must fix that
    model = jobkit.make_model()
    params = list(model.parameters())
    before = [p.detach().clone() for p in params]
    if kv.is_master_worker:
        optimizer_class = geomx.optim.DCASGD if args.dcasgd else geomx.optim.SGD
        kv.set_optimizer(optimizer_class(lr=args.lr, momentum=args.momentum))
    kv.init(list(range(len(params))), [p.data for p in params])
    after = [p.detach().clone() for p in params]
    inputs, targets = jobkit.make_data(args.steps, kv.num_all_workers)

    for step in range(args.steps):
        if step == args.fault_step:
            if rank == args.die_rank:
                (jobkit.out_dir(kv.config.run_dir) / "death.json").write_text(json.dumps({"time": time.time()}))
                os._exit(3)
            if rank == args.raise_rank:
                (jobkit.out_dir(kv.config.run_dir) / "raise.json").write_text(json.dumps({"time": time.time()}))
                raise RuntimeError(f"injected failure in {kv.name} at step {step}")
            if rank == args.bad_requests_rank:
                report["bad_requests"] = jobkit.bad_requests(kv)
            if rank == args.fuzz_rank:
                report["fuzz"] = jobkit.fuzz(kv, args.fuzz_frames)
            if rank == args.poison_rank:
                report["poison"] = jobkit.poison(kv)
        model.zero_grad()
        loss = F.mse_loss(model(inputs[step, rank]), targets[step, rank])
        loss.backward()
        forging = step == args.fault_step and args.forge_rank >= 0
        if forging and rank != args.forge_rank:
            kv.barrier()  # hold this round back until the forger is done (its server's forwards stay pending)
        for idx, param in enumerate(params):
            kv.push(idx, param.grad, priority=-idx)
        if forging and rank == args.forge_rank:
            report["forge"] = jobkit.forge_replies(kv, rounds=2)
            kv.barrier()
        for idx, param in enumerate(params):
            kv.pull(idx, param.data, priority=-idx)

    kv.barrier()
    if kv.is_master_worker:
        report["wan_bytes"] = kv.wan_bytes()
        report["stats"] = kv.stats()
    jobkit.save_worker_output(kv.config.run_dir, rank, {"before_init": before, "after_init": after,
                                                         "final": [p.detach().clone() for p in params]}, report)
    print(f"{kv.name} (global rank {rank}) finished {args.steps} steps", flush=True)
    kv.close()


if __name__ == "__main__":
    jobkit.run_and_exit(main)
