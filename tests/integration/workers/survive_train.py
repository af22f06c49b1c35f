"""Worker of the survival tests: jobkit's FSA training (SGD with momentum on the global server), plus faults.

Faults (at ``--fault-step``, by the worker of global rank ``--fault-rank``):
  --freeze self            SIGSTOP this worker (alive but silent: only heartbeats can tell)
  --freeze global_server   SIGSTOP the job's global server
  --freeze party           SIGSTOP every process of this worker's party (scheduler, server, workers, itself last)
  --kill global_server     SIGKILL the job's global server, once a checkpoint of step >= --wait-checkpoint exists
  --hold-until FILE        wait (at most 120 s) until run_dir/FILE exists, e.g. while a fuzzer sprays the job

``--resume-from-checkpoint``: start at the step of the newest valid checkpoint (what a resumed job does).
Every worker that ends writes ``out/worker<rank>.pt/.json`` (jobkit); one that fails writes
``out/error<rank>.json`` with the exception's text, then re-raises.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path

import jobkit
import torch
import torch.nn.functional as F

import geomx
from geomx.launch import job_processes
from geomx.runs.checkpoint import load_latest


def find_pids(run_dir: Path, **wanted: str) -> list[int]:
    """Pids of this job's processes whose environment has every GEOMX_<KEY>=value of ``wanted``."""
    pids = [pid for pid, env in job_processes({str(run_dir)}).items()
            if all(env.get(f"GEOMX_{k.upper()}") == v for k, v in wanted.items())]
    if not pids:
        raise RuntimeError(f"no process with {wanted} in run {run_dir}")
    return pids


def find_pid(run_dir: Path, role: str) -> int:
    return find_pids(run_dir, role=role)[0]


def wait_for_checkpoint(folder: Path, step: int, timeout: float = 30.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        snapshot = load_latest(folder, shard=0)
        if snapshot is not None and snapshot.step >= step:
            return snapshot.step
        time.sleep(0.05)
    raise RuntimeError(f"no checkpoint of step >= {step} in {folder} within {timeout} s")


def wait_for_file(path: Path, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{path} did not appear within {timeout} s")
        time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=jobkit.STEPS)
    parser.add_argument("--fault-step", type=int, default=-1)
    parser.add_argument("--fault-rank", type=int, default=-1)
    parser.add_argument("--freeze", choices=["self", "global_server", "party"])
    parser.add_argument("--kind", default="dist_sync", help="kvstore type")
    parser.add_argument("--step-seconds", type=float, default=0.0,
                        help="simulated compute time per step from the fault step on")
    parser.add_argument("--kill", choices=["global_server"])
    parser.add_argument("--wait-checkpoint", type=int, default=0)
    parser.add_argument("--hold-until")
    parser.add_argument("--resume-from-checkpoint", action="store_true")
    args = parser.parse_args()
    kv = geomx.kv.create(args.kind)
    rank = kv.global_rank
    run_dir = Path(kv.config.run_dir or ".")
    out = jobkit.out_dir(run_dir)
    torch.manual_seed(jobkit.seed_for(rank))
    model = jobkit.make_model()
    params = list(model.parameters())
    before = [p.detach().clone() for p in params]
    if kv.is_master_worker:
        kv.set_optimizer(geomx.optim.SGD(lr=jobkit.LR, momentum=jobkit.MOMENTUM))
    kv.init(list(range(len(params))), [p.data for p in params])
    after = [p.detach().clone() for p in params]
    report: dict = {"name": kv.name, "global_rank": rank}
    # where the job checkpoints, the step it goes on from: the resumed global server's (it holds the model)
    checkpoints = kv.config.topology.checkpoint.dir
    first = kv.start_step() if checkpoints is not None else 0
    if args.resume_from_checkpoint:
        report["resumed_at"] = first
    inputs, targets = jobkit.make_data(args.steps, kv.num_all_workers)
    try:
        for step in range(first, args.steps):
            if step == args.fault_step and rank == args.fault_rank:
                (out / "fault.json").write_text(json.dumps({"time": time.time(), "step": step}))
                if args.freeze == "self":
                    os.kill(os.getpid(), signal.SIGSTOP)
                elif args.freeze == "global_server":
                    os.kill(find_pid(run_dir, "global_server"), signal.SIGSTOP)
                elif args.freeze == "party":
                    for pid in sorted(find_pids(run_dir, party=kv.party), key=lambda p: p == os.getpid()):
                        os.kill(pid, signal.SIGSTOP)
                elif args.hold_until:
                    wait_for_file(run_dir / args.hold_until)
                elif args.kill == "global_server":
                    assert checkpoints is not None
                    saved = wait_for_checkpoint(checkpoints, args.wait_checkpoint)
                    (out / "fault.json").write_text(json.dumps({"time": time.time(), "step": step,
                                                                "checkpoint_step": saved}))
                    os.kill(find_pid(run_dir, "global_server"), signal.SIGKILL)
            if args.step_seconds and step >= args.fault_step:
                time.sleep(args.step_seconds)  # compute time: keeps the survivors training after the fault
            model.zero_grad()
            F.mse_loss(model(inputs[step, rank]), targets[step, rank]).backward()
            for idx, param in enumerate(params):
                kv.push(idx, param.grad, priority=-idx)
            for idx, param in enumerate(params):
                kv.pull(idx, param.data, priority=-idx)
    except Exception as exc:
        (out / f"error{rank}.json").write_text(json.dumps({"time": time.time(), "error": f"{type(exc).__name__}: "
                                                                                       f"{exc}"}))
        raise
    jobkit.save_worker_output(run_dir, rank, {"before_init": before, "after_init": after,
                                              "final": [p.detach().clone() for p in params]}, report)
    kv.close()


if __name__ == "__main__":
    jobkit.run_and_exit(main)
