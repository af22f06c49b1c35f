"""Bench peer: the WAN job (``geomx.wan_job``) under torchft's DiLoCo, four replica groups of one rank each.

Needs the optional extra ``geomx[peers]`` (torchft). One process per rank, a ``torchft_lighthouse`` in data
center A (``geomx bench --only wan`` starts all of them)::

    torchft_lighthouse --min_replicas 4 --bind 10.250.1.1:29510
    python -m geomx.bench_workers.diloco --rank 0 --host 10.250.1.1 --lighthouse http://10.250.1.1:29510 \\
        --sync-every 10 --log runs/diloco/rank0.jsonl

Every rank trains alone with the job's inner optimizer (SGD, momentum 0.9) and every ``--sync-every`` (H)
steps DiLoCo all-reduces the pseudo-gradients of the four replica groups over torchft's gloo process group
and applies the outer Nesterov optimizer (lr 0.7, momentum 0.9). With one rank per replica group there is
no torchrun, so each rank hosts its group's TCPStore itself, advertises its namespace address to the
lighthouse (``hostname=``), and skips the start-up weight sync (``init_sync=False``: the seeds are equal, and
torchft's HTTP checkpoint transport would advertise the machine's host name, which the namespaces cannot
reach). Rank 0 evaluates the job's model right after each outer step (all replicas then hold it).
"""

from __future__ import annotations

import argparse
import datetime

import torch
import torch.distributed as dist

from geomx import wan_job, wan_jobs


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rank", type=int, required=True, help="the replica group (its data shard)")
    parser.add_argument("--world", type=int, default=wan_job.WORLD)
    parser.add_argument("--host", required=True, help="this namespace's address (store, manager, gloo)")
    parser.add_argument("--lighthouse", required=True, help="http://HOST:PORT of torchft_lighthouse")
    parser.add_argument("--sync-every", type=int, default=10)
    parser.add_argument("--log", required=True)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--job", choices=wan_jobs.JOBS, default="mlp", help="the model, data and evaluation")
    parser.add_argument("--timeout-s", type=float, default=600.0)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from torchft import Manager, ProcessGroupGloo
    from torchft.local_sgd import DiLoCo

    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=args.timeout_s)
    # this replica group's store (torchrun would host it): port 0 = the OS picks; the Manager connects to it
    store = dist.TCPStore(args.host, 0, 1, is_master=True, timeout=timeout, wait_for_workers=False)
    store_port = int(store.port)
    job = wan_jobs.job(args.job)
    calibrated = job.calibrate_step_s()
    model = job.make_model()
    inner = job.make_optimizer(model.parameters(), False)
    outer = torch.optim.SGD(model.parameters(), lr=wan_job.OUTER_LR, momentum=wan_job.OUTER_MOMENTUM, nesterov=True)
    manager = Manager(pg=ProcessGroupGloo(timeout=timeout), load_state_dict=None, state_dict=None,
                      min_replica_size=args.world, use_async_quorum=False, timeout=timeout, quorum_timeout=timeout,
                      connect_timeout=timeout, rank=0, world_size=1, store_addr=args.host, store_port=store_port,
                      lighthouse_addr=args.lighthouse, replica_id=f"rank{args.rank}", hostname=args.host,
                      init_sync=False)
    shard, test, steps = job.shard_and_test(args.rank, args.world)
    timer = wan_job.ComputeTimer()
    log = wan_job.JobLog(args.log, args.rank, f"diloco_h{args.sync_every}", job.metric)
    step = 0
    with DiLoCo(manager, [model], inner, outer, sync_every=args.sync_every):
        for epoch, images, labels in wan_job.batches(shard, args.rank, args.epochs, steps):
            with timer("forward"):
                inner.zero_grad()
                loss = job.loss_of(model, images, labels)
            with timer("backward"):
                loss.backward()
            synced = (step + 1) % args.sync_every == 0
            if synced:
                inner.step()  # the outer round (all-reduce + outer Nesterov) runs in the step hook: not compute
            else:
                with timer("optimizer"):
                    inner.step()
            step += 1
            if args.rank == 0 and synced:
                log.write(step=step, epoch=epoch, value=log.evaluate(lambda: job.evaluate(model, test)), compute=timer,
                          loss=float(loss.detach()), calibrated_step_s=calibrated, manager_step=manager.current_step())
    log.close()
    manager.shutdown(wait=False)


if __name__ == "__main__":
    main()
