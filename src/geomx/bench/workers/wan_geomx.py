"""Bench worker: the WAN job (``geomx.bench.wan.job``) under geomx, one process per worker, started by ``geomx launch``.

The algorithm comes from the topology (``hfa: {k1, k2}`` for HFA; emulator off in ``geomx bench --only wan``);
the loop only chooses what it pushes::

    geomx launch wan.yaml --party dc0 ... -- python -m geomx.bench.workers.wan_geomx --log-dir runs/fsa
    geomx launch wan_hfa.yaml ... -- python -m geomx.bench.workers.wan_geomx --log-dir runs/hfa --outer
    ... --compression '{"type": "bsc", "threshold": 0.01, "momentum": 0.9}'  # Bi-Sparse on the WAN tier

FSA (no ``hfa`` in the topology): every step each worker pushes its gradient, pulls the sum of all workers'
and steps the job's SGD on the mean (the servers only sum: the same arithmetic as DDP). With a residual
codec (Bi-Sparse) the local SGD has no momentum of its own: the codec's momentum correction is the momentum.
HFA: local SGD steps; every K1 steps a model average in the party, every K1*K2 steps a global one (with
``--outer``, DiLoCo's outer Nesterov on the global server). The master worker evaluates the job's model:
after every ``--eval-every`` FSA steps (its own model: every worker holds the job's); under HFA every K1*K2
steps, on a copy filled with the job's model as its party's local server holds it (``kv.pull_job_model``: the
global model; under streaming each fragment's last global model, which no worker holds whole).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import geomx
from geomx.bench.wan import job as wan_job
from geomx.bench.wan import jobs as wan_jobs


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = wan_jobs.geomx_worker_parser(__doc__)
    parser.add_argument("--outer", action="store_true", help="HFA: outer Nesterov (lr 0.7, momentum 0.9)")
    parser.add_argument("--compression", default="null", help="JSON WAN codec spec, or null")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)
    spec = json.loads(args.compression)
    kv = geomx.kv.create("dist_sync")
    job = wan_jobs.job(args.job)
    calibrated = job.calibrate_step_s()
    model = job.make_model()
    params = list(model.parameters())
    if kv.is_master_worker:
        if spec is not None:
            kv.set_gradient_compression(spec)
        if args.outer:
            kv.set_optimizer(geomx.optim.OuterNesterov(lr=wan_job.OUTER_LR, momentum=wan_job.OUTER_MOMENTUM))
    kv.init(list(range(len(params))), [p.data for p in params])
    residual_codec = spec is not None and spec.get("type") in ("bsc", "mpq") and kv.hfa is None
    optimizer = job.make_optimizer(params, residual_codec)
    rank, world = kv.global_rank, kv.num_all_workers
    shard, test, steps = job.shard_and_test(rank, world)
    hfa = kv.hfa
    system = "geomx_hfa" if hfa else "geomx_fsa"
    held = job.make_model() if hfa else model  # what the master worker evaluates
    keys, held_params = list(range(len(params))), [p.data for p in held.parameters()]

    def evaluate() -> float:
        return job.evaluate(held, test)

    log = wan_job.JobLog(Path(args.log_dir) / f"rank{rank}.jsonl", rank, system, job.metric)
    timer = wan_job.ComputeTimer()
    step = 0
    last = args.epochs * steps
    for epoch, images, labels in wan_job.batches(shard, rank, args.epochs, steps):
        with timer("forward"):
            optimizer.zero_grad()
            loss = job.loss_of(model, images, labels)
        with timer("backward"):
            loss.backward()
        if hfa is None:
            for idx, param in enumerate(params):
                kv.push(idx, param.grad, priority=-idx)
            for idx, param in enumerate(params):
                kv.pull(idx, param.grad, priority=-idx)
            for param in params:
                param.grad /= world
        with timer("optimizer"):
            optimizer.step()
        step += 1
        if hfa is not None and step % hfa.k1 == 0:  # a party average, every K2-th time the global one
            for idx, param in enumerate(params):
                kv.push(idx, param.data / kv.num_workers, priority=-idx)
            for idx, param in enumerate(params):
                kv.pull(idx, param.data, priority=-idx)
        due = step % (hfa.k1 * hfa.k2) == 0 if hfa else (step % args.eval_every == 0 or step == last)
        if kv.is_master_worker and due:
            if hfa:  # on the clock: it waits for a streaming fragment's answer still on its way (every sync lands)
                kv.pull_job_model(keys, held_params)
            log.write(step=step, epoch=epoch, value=log.evaluate(evaluate), compute=timer,
                      loss=float(loss.detach()),
                      calibrated_step_s=calibrated)
    log.close()
    kv.close()


if __name__ == "__main__":
    main()
