"""Bench peer: the WAN job (``geomx.bench.wan.job``) under torch DDP over gloo, or DDP + PyTorch's local SGD.

One process per rank (``geomx bench --only wan`` starts ranks 0-1 in namespace A, 2-3 in B)::

    python -m geomx.bench.workers.ddp --rank 0 --world 4 --master 10.250.1.1:29500 --log runs/ddp/rank0.jsonl
    python -m geomx.bench.workers.ddp ... --local-sgd-period 10    # PostLocalSGDOptimizer + PeriodicModelAverager

Plain DDP all-reduces the gradients of all ranks every step. With ``--local-sgd-period H`` the DDP hook
``post_localSGD_hook`` all-reduces gradients only inside each data center's subgroup (ranks {0,1} and
{2,3}: PyTorch's hierarchical local SGD) and ``PeriodicModelAverager`` averages the model over all ranks
every H steps. Rank 0 evaluates the job's model (for local SGD right after each averaging round) and
writes JSON lines (see ``geomx.bench.wan.job.JobLog``).
"""

from __future__ import annotations

import argparse
import datetime

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from geomx.bench.wan import job as wan_job
from geomx.bench.wan import jobs as wan_jobs
from geomx.bench.workers.teardown import leave_process_group


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, default=wan_job.WORLD)
    parser.add_argument("--master", required=True, help="HOST:PORT of rank 0's TCPStore")
    parser.add_argument("--log", required=True, help="JSON lines file of this rank")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--eval-every", type=int, default=5, help="plain DDP: evaluate every N steps")
    parser.add_argument("--local-sgd-period", type=int, default=0, help="H; 0 = plain DDP")
    parser.add_argument("--job", choices=wan_jobs.JOBS, default="mlp", help="the model, data and evaluation")
    parser.add_argument("--timeout-s", type=float, default=600.0)
    return parser.parse_args(argv)


def local_sgd(model: torch.nn.Module, period: int, world: int,
              job: wan_job.Job) -> tuple[DistributedDataParallel, torch.optim.Optimizer]:
    """DDP with the post-local-SGD hook over two-rank subgroups, and the periodic model averager."""
    from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import PostLocalSGDState, post_localSGD_hook
    from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
    from torch.distributed.optim import PostLocalSGDOptimizer

    subgroup, _ = dist.new_subgroups(group_size=world // 2)  # one subgroup per data center: {0,1}, {2,3}
    ddp = DistributedDataParallel(model)
    # local SGD from the first step; the averager (its counter starts at 0, it averages when (count - warmup) % H
    # == 0) averages after steps H, 2H, ... with warmup H - 1
    ddp.register_comm_hook(PostLocalSGDState(process_group=None, subgroup=subgroup, start_localSGD_iter=0),
                           post_localSGD_hook)
    optimizer = PostLocalSGDOptimizer(optim=job.make_optimizer(ddp.parameters(), False),
                                      averager=PeriodicModelAverager(period=period, warmup_steps=period - 1))
    return ddp, optimizer


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)
    host, port = args.master.rsplit(":", 1)
    store = dist.TCPStore(host, int(port), args.world, is_master=args.rank == 0,
                          timeout=datetime.timedelta(seconds=args.timeout_s))
    dist.init_process_group("gloo", store=store, rank=args.rank, world_size=args.world,
                            timeout=datetime.timedelta(seconds=args.timeout_s))
    period = args.local_sgd_period
    system = f"local_sgd_h{period}" if period else "ddp"
    job = wan_jobs.job(args.job)
    calibrated = job.calibrate_step_s()
    model = job.make_model()
    if period:
        ddp, optimizer = local_sgd(model, period, args.world, job)
    else:
        ddp = DistributedDataParallel(model)
        optimizer = job.make_optimizer(ddp.parameters(), False)
    shard, test, steps = job.shard_and_test(args.rank, args.world)
    timer = wan_job.ComputeTimer()
    dist.barrier()
    log = wan_job.JobLog(args.log, args.rank, system, job.metric)
    step = 0
    for epoch, images, labels in wan_job.batches(shard, args.rank, args.epochs, steps):
        with timer("forward"):
            optimizer.zero_grad()
            loss = job.loss_of(ddp, images, labels)
        with timer("backward"):
            loss.backward()  # DDP's all-reduce (or the subgroup's) runs inside
        with timer("optimizer"):
            optimizer.step()  # local SGD: the model average every H steps runs inside
        step += 1
        due = step % period == 0 if period else (step % args.eval_every == 0 or step == args.epochs * steps)
        if args.rank == 0 and due:
            log.write(step=step, epoch=epoch, value=log.evaluate(lambda: job.evaluate(model, test)), compute=timer,
                      loss=float(loss.detach()), calibrated_step_s=calibrated)
    log.close()
    leave_process_group()


if __name__ == "__main__":
    main()
