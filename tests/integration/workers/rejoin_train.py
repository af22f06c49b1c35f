"""Integration worker of the rejoin tests: a party dies (kill -9 of all its processes), is restarted, rejoins.

One worker per party. ``--kind dist_sync`` (FSA), ``dist_async`` (MixedSync) or ``dist_ssp`` (SSP): every step
pushes its gradient and pulls the global server's weights (SGD on the global server). With ``hfa`` in the
topology: HFA, local SGD steps and every K1 steps a push of the model and a pull of the global average (with
``--outer``, DiLoCo: the global server's outer Nesterov); with ``--esync`` the number of local steps before the next
average is ESync's assignment (``kv.assign_local_steps``) instead of K1.

Roles, by flags:
  --die-step N        at step N, SIGKILL (--kill) this worker's whole party (itself last), itself, its party's
                      local server or the global server (--die-rank: only that worker; --fault-file: where the
                      time of the fault is written)
  --until-file PATH   train until PATH exists (at most --max-steps), then --after more steps: the survivor
  --rejoined-file PATH  after init, create PATH: the restarted party's worker

Every worker that ends writes ``out/worker<rank>.pt/.json`` (jobkit) with its weights before and after init,
every model it pulled (``pulled``, one list of tensors per sync; under HFA every model it pushed,
``pushed``) and its final weights; its report has the
time each sync ended (``sync_ends``), the job's start (``job_start``) and this worker's first push
(``first_push``).
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from pathlib import Path

import jobkit
import torch
import torch.nn.functional as F
from survive_train import find_pids

import geomx


def victims(run_dir: Path, party: str, target: str) -> list[int]:
    """The pids to SIGKILL for ``target``, this worker last."""
    if target == "worker":
        return [os.getpid()]
    if target == "party":
        return sorted(find_pids(run_dir, party=party), key=lambda pid: pid == os.getpid())
    return find_pids(run_dir, role=target)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kind", default="dist_sync")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--die-step", type=int, default=-1)
    parser.add_argument("--die-rank", type=int, help="the worker (global rank) that injects the fault")
    parser.add_argument("--kill", choices=["party", "worker", "local_server", "global_server"], default="party")
    parser.add_argument("--fault-file")
    parser.add_argument("--esync", action="store_true", help="HFA rounds of ESync-assigned length")
    parser.add_argument("--until-file")
    parser.add_argument("--max-steps", type=int, default=2000)
    parser.add_argument("--after", type=int, default=10)
    parser.add_argument("--rejoined-file")
    parser.add_argument("--step-seconds", type=float, default=0.02, help="simulated compute time per step")
    parser.add_argument("--outer", action="store_true", help="HFA: the master installs DiLoCo's outer Nesterov")
    args = parser.parse_args()
    kv = geomx.kv.create(args.kind)
    rank = kv.global_rank
    run_dir = Path(kv.config.run_dir or ".")
    torch.manual_seed(jobkit.seed_for(rank) + (1000 if args.rejoined_file else 0))
    model = jobkit.make_model()
    params = list(model.parameters())
    before = [p.detach().clone() for p in params]
    hfa = kv.hfa
    if kv.is_master_worker and (hfa is None or args.outer):
        kv.set_optimizer(geomx.optim.SGD(lr=jobkit.LR) if hfa is None else geomx.optim.OuterNesterov())
    kv.init(list(range(len(params))), [p.data for p in params])
    after = [p.detach().clone() for p in params]
    if args.rejoined_file:
        Path(args.rejoined_file).write_text(str(time.time()))
    local = torch.optim.SGD(params, lr=jobkit.LR)
    steps = jobkit.SurvivorSteps(args.steps, args.until_file, args.max_steps, args.after)
    inputs, targets = jobkit.make_data(steps.total, kv.num_all_workers)
    pulled: list[torch.Tensor] = []
    pushed: list[torch.Tensor] = []
    sync_ends: list[float] = []
    first_push: float | None = None  # time.time() of this worker's first push (a ``from: training`` outage's origin)
    done = 0
    local_steps = hfa.k1 if hfa is not None else 1  # local steps before the next average
    since_sync, round_started = 0, time.monotonic()
    for step in steps:
        done += 1
        if step == args.die_step and args.die_rank in (None, rank):
            if args.fault_file:
                Path(args.fault_file).write_text(repr(time.time()))
            for pid in victims(run_dir, kv.party, args.kill):
                os.kill(pid, signal.SIGKILL)
        time.sleep(args.step_seconds)
        local.zero_grad()
        F.mse_loss(model(inputs[step, rank]), targets[step, rank]).backward()
        if first_push is None and (hfa is None or since_sync + 1 >= local_steps):
            first_push = time.time()
        if hfa is None:  # FSA / MixedSync: the global server steps on the (summed) gradients
            for idx, param in enumerate(params):
                kv.push(idx, param.grad, priority=-idx)
        else:
            local.step()
            since_sync += 1
            if since_sync < local_steps:
                continue
            per_step = (time.monotonic() - round_started) / since_sync  # compute only, as ESync measures it
            pushed.extend(p.detach().clone() for p in params)
            for idx, param in enumerate(params):
                kv.push(idx, param.data / kv.num_workers, priority=-idx)
        for idx, param in enumerate(params):
            kv.pull(idx, param.data, priority=-idx)
        pulled.extend(p.detach().clone() for p in params)
        sync_ends.append(time.time())
        if hfa is not None and args.esync:
            local_steps = kv.assign_local_steps(per_step, base_steps=hfa.k1)
        since_sync, round_started = 0, time.monotonic()
    report = {"name": kv.name, "syncs": len(pulled) // len(params), "steps": done, "sync_ends": sync_ends,
              "job_start": kv.config.topology.job_start, "first_push": first_push}
    tensors = {"before_init": before, "after_init": after, "pulled": pulled, "pushed": pushed,
               "final": [p.detach().clone() for p in params]}
    jobkit.save_worker_output(run_dir, rank, tensors, report)
    kv.close()


if __name__ == "__main__":
    jobkit.run_and_exit(main)
