"""Bench worker: the WAN job (``geomx.bench.wan.job``) through the PyTorch wrapper, ``gx.DistributedOptimizer``.

The same job, data and evaluation as ``wan_geomx`` (the kvstore loop); the algorithm and where the optimizer
runs come from the topology, as for any user of the wrapper: under FSA the job's SGD steps on every worker on
the mean of the gradients (``server_optimizer: auto``; the servers only sum, as in ``wan_geomx`` and DDP) or,
with ``server_optimizer: translate``, runs on the global server, which answers new weights::

    geomx launch wan.yaml --party dc0 ... -- python -m geomx.bench.workers.wan_torch --log-dir runs/fsa-wrapper

The master worker evaluates the job's model every ``--eval-every`` steps (``opt.load_job_model``).
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

import torch

import geomx.torch as gx
from geomx.bench.wan import job as wan_job
from geomx.bench.wan import jobs as wan_jobs


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return wan_jobs.geomx_worker_parser(__doc__).parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)
    job = wan_jobs.job(args.job)
    calibrated = job.calibrate_step_s()
    model = job.make_model()
    opt = gx.DistributedOptimizer(job.make_optimizer(list(model.parameters()), False), model)
    rank, world = opt.global_rank, opt.num_all_workers
    shard, test, steps = job.shard_and_test(rank, world)
    held = copy.deepcopy(model)  # what the master evaluates: the job's model

    def evaluate() -> float:
        return job.evaluate(held, test)

    log = wan_job.JobLog(Path(args.log_dir) / f"rank{rank}.jsonl", rank, "geomx_torch", job.metric)
    timer = wan_job.ComputeTimer()
    step, last = 0, args.epochs * steps
    for epoch, images, labels in wan_job.batches(shard, rank, args.epochs, steps):
        with timer("forward"):
            opt.zero_grad()
            loss = job.loss_of(model, images, labels)
        with timer("backward"):
            loss.backward()
        opt.step()
        step += 1
        if opt.is_master_worker and (step % args.eval_every == 0 or step == last):
            opt.load_job_model(held)  # on the clock: every sync of the job's model lands first
            log.write(step=step, epoch=epoch, value=log.evaluate(evaluate), compute=timer,
                      loss=float(loss.detach()), calibrated_step_s=calibrated)
    log.close()
    opt.close()


if __name__ == "__main__":
    main()
