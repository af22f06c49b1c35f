"""Integration worker for MixedSync (dist_async): plain SGD on the global server, one party slowed down.

Each worker pushes its gradient every step and records the sum of everything it pushed, how long its
training loop took, and (after a barrier) the global weights it pulls. With plain SGD every applied push
moves the weights by -lr * rescale * push, in any order, so the final weights must equal
w0 - lr * rescale * (sum of all pushes): each push applied exactly once.
"""

from __future__ import annotations

import argparse
import time

import jobkit
import torch
import torch.nn.functional as F

import geomx


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--slow-party", default="dc1")
    parser.add_argument("--delay", type=float, default=0.25, help="seconds of extra compute per step")
    parser.add_argument("--base-delay", type=float, default=0.0,
                        help="seconds of compute per step of every party (the slow party's is --delay)")
    parser.add_argument("--kind", default="dist_async")
    parser.add_argument("--leave-early", action="store_true",
                        help="no final barrier: the fast party closes as soon as it is done; the slow party "
                             "goes on until it has seen every fast worker's close return")
    args = parser.parse_args()
    kv = geomx.kv.create(args.kind)
    rank = kv.global_rank
    torch.manual_seed(jobkit.seed_for(rank))
    model = jobkit.make_model()
    params = list(model.parameters())
    if kv.is_master_worker:
        kv.set_optimizer(geomx.optim.SGD(lr=jobkit.LR, rescale_grad=1.0))
    kv.init(list(range(len(params))), [p.data for p in params])
    initial = [p.detach().clone() for p in params]
    pushed = [torch.zeros_like(p) for p in params]
    inputs, targets = jobkit.make_data(args.steps, kv.num_all_workers)
    started = time.monotonic()
    for step in range(args.steps):
        if kv.party == args.slow_party:
            time.sleep(args.delay)  # an emulated slow data center (slower GPUs)
        elif args.base_delay:
            time.sleep(args.base_delay)
        model.zero_grad()
        F.mse_loss(model(inputs[step, rank]), targets[step, rank]).backward()
        for idx, param in enumerate(params):
            pushed[idx] += param.grad
            kv.push(idx, param.grad)
        for idx, param in enumerate(params):
            kv.pull(idx, param.data)
    train_s = time.monotonic() - started
    if args.leave_early:
        _leave_early(kv, args.slow_party, rank, params, initial, pushed, train_s, args.steps)
        return
    kv.barrier()
    for idx, param in enumerate(params):
        kv.pull(idx, param.data)
    jobkit.save_worker_output(kv.config.run_dir, rank, {"initial": initial, "pushed": pushed,
                                                        "final": [p.detach().clone() for p in params]},
                              {"party": kv.party, "train_s": train_s, "steps": args.steps})
    kv.close()


def _leave_early(kv: geomx.kv.KVStore, slow_party: str, rank: int, params: list[torch.Tensor],
                 initial: list[torch.Tensor], pushed: list[torch.Tensor], train_s: float, steps: int) -> None:
    """Fast party: close, then leave a marker. Slow party: wait (bounded) for every fast marker, then pull."""
    run_dir = kv.config.run_dir
    assert run_dir is not None
    fast_ranks = [r for r in range(kv.num_all_workers) if r not in _party_ranks(kv, slow_party)]
    if kv.party != slow_party:
        kv.close()
        (run_dir / f"closed-{rank}").write_text(str(time.time()))
        jobkit.save_worker_output(run_dir, rank, {"initial": initial, "pushed": pushed},
                                  {"party": kv.party, "train_s": train_s, "steps": steps})
        return
    deadline = time.monotonic() + 60.0
    while not all((run_dir / f"closed-{r}").exists() for r in fast_ranks):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the fast workers {fast_ranks} did not get out of close() within 60 s")
        time.sleep(0.05)
    for idx, param in enumerate(params):
        kv.pull(idx, param.data)
    jobkit.save_worker_output(run_dir, rank, {"initial": initial, "pushed": pushed,
                                              "final": [p.detach().clone() for p in params]},
                              {"party": kv.party, "train_s": train_s, "steps": steps,
                               "fast_closed_before_pull": True})
    kv.close()


def _party_ranks(kv: geomx.kv.KVStore, party: str) -> range:
    offset = kv.config.topology.worker_offset(party)
    count = next(p.num_workers for p in kv.config.topology.parties if p.name == party)
    return range(offset, offset + count)


if __name__ == "__main__":
    jobkit.run_and_exit(main)
