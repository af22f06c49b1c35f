"""Bench peer: the WAN job (``geomx.bench.wan_job``) under torchft's DiLoCo, four replica groups of one rank each.

Needs the optional extra ``geomx[peers]`` (torchft). One process per rank, a ``torchft_lighthouse`` in data
center A (``geomx bench --only wan`` starts all of them)::

    torchft_lighthouse --min_replicas 4 --bind 10.250.1.1:29510
    python -m geomx.bench.workers.diloco --rank 0 --host 10.250.1.1 --lighthouse http://10.250.1.1:29510 \\
        --sync-every 10 --log runs/diloco/rank0.jsonl

Every rank trains alone with the job's inner optimizer (SGD, momentum 0.9) and every ``--sync-every`` (H)
steps DiLoCo all-reduces the pseudo-gradients of the four replica groups over torchft's gloo process group
and applies the outer Nesterov optimizer (lr 0.7, momentum 0.9). With one rank per replica group there is
no torchrun, so each rank hosts its group's TCPStore itself, advertises its namespace address to the
lighthouse (``hostname=``), and skips the start-up weight sync (``init_sync=False``: the seeds are equal, and
torchft's HTTP checkpoint transport would advertise the machine's host name, which the namespaces cannot
reach). Rank 0 evaluates the job's model every H steps: each fragment's global model (what its last outer
step made, torchft's ``original_parameters``), which with one fragment is the model every replica holds.

Streaming DiLoCo (``--fragments F --fragment-sync-delay D --fragment-alpha A``): torchft's fragments are modules;
the model's modules with parameters go into F groups of about equal size (largest first, each to the smallest
group); a fragment syncs every H / F steps in turn, its all-reduce overlapping the next D steps.
"""

from __future__ import annotations

import argparse
import datetime
from typing import Any

import torch
import torch.distributed as dist

from geomx.bench import wan_job, wan_jobs


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
    parser.add_argument("--fragments", type=int, default=1, help="streaming: model fragments (H must divide)")
    parser.add_argument("--fragment-sync-delay", type=int, default=0, help="streaming: steps an all-reduce overlaps")
    parser.add_argument("--fragment-alpha", type=float, default=0.0, help="streaming: the local model's share")
    return parser.parse_args(argv)


def fragments_of(model: torch.nn.Module, count: int) -> list[torch.nn.Module]:
    """The model's modules that hold parameters, in ``count`` groups of about equal size (largest first, each to
    the smallest group; ties: the lower group, the earlier module)."""
    owners = [m for m in model.modules() if any(True for _ in m.parameters(recurse=False))]
    groups: list[list[torch.nn.Module]] = [[] for _ in range(count)]
    loads = [0] * count
    for module in sorted(owners, key=lambda m: -sum(p.numel() for p in m.parameters(recurse=False))):
        group = min(range(count), key=lambda g: (loads[g], g))
        groups[group].append(module)
        loads[group] += sum(p.numel() for p in module.parameters(recurse=False))
    if not all(groups):
        raise SystemExit(f"{len(owners)} modules with parameters cannot make {count} fragments")
    return [torch.nn.ModuleList(group) for group in groups]


def load_global_model(diloco: Any, model: torch.nn.Module, into: torch.nn.Module) -> None:
    """``into`` := the job's model: every fragment's global parameters (torchft's ``original_parameters``, the
    model its last outer step made; private to torchft 0.2.0, read only here)."""
    names = {id(p): name for name, p in model.named_parameters()}
    target = dict(into.named_parameters())
    with torch.no_grad():
        for fragment in diloco._fragments:
            for name, param in fragment._model_fragment.named_parameters():
                target[names[id(param)]].copy_(fragment.original_parameters[name])


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
    manager = Manager(pg=ProcessGroupGloo(timeout=timeout), load_state_dict=None, state_dict=None,
                      min_replica_size=args.world, use_async_quorum=False, timeout=timeout, quorum_timeout=timeout,
                      connect_timeout=timeout, rank=0, world_size=1, store_addr=args.host, store_port=store_port,
                      lighthouse_addr=args.lighthouse, replica_id=f"rank{args.rank}", hostname=args.host,
                      init_sync=False)
    shard, test, steps = job.shard_and_test(args.rank, args.world)
    timer = wan_job.ComputeTimer()

    def evaluate(diloco: DiLoCo) -> float:
        load_global_model(diloco, model, held)
        return job.evaluate(held, test)

    # the clock starts where DDP's and geomx's do, with every rank joined: after a first quorum (the lighthouse's
    # rendezvous and the gloo group's set-up), which DiLoCo would otherwise run inside the first timed steps
    manager.start_quorum()
    manager.wait_quorum()
    log = wan_job.JobLog(args.log, args.rank, f"diloco_h{args.sync_every}", job.metric)
    step = 0
    fragments = fragments_of(model, args.fragments) if args.fragments > 1 else [model]
    outer = [torch.optim.SGD(fragment.parameters(), lr=wan_job.OUTER_LR, momentum=wan_job.OUTER_MOMENTUM,
                             nesterov=True) for fragment in fragments]  # one outer optimizer per fragment
    held = job.make_model()  # evaluated: the job's model
    every = args.sync_every // len(fragments)  # a fragment's outer step every this many steps
    with DiLoCo(manager, fragments, inner, outer, sync_every=args.sync_every,
                fragment_sync_delay=args.fragment_sync_delay, fragment_update_alpha=args.fragment_alpha) as diloco:
        for epoch, images, labels in wan_job.batches(shard, args.rank, args.epochs, steps):
            with timer("forward"):
                inner.zero_grad()
                loss = job.loss_of(model, images, labels)
            with timer("backward"):
                loss.backward()
            synced = (step + 1) % every == 0
            if synced:
                inner.step()  # the outer round (all-reduce + outer Nesterov) runs in the step hook: not compute
            else:
                with timer("optimizer"):
                    inner.step()
            step += 1
            if args.rank == 0 and step % args.sync_every == 0:
                log.write(step=step, epoch=epoch, value=log.evaluate(lambda: evaluate(diloco)), compute=timer,
                          loss=float(loss.detach()), calibrated_step_s=calibrated, manager_step=manager.current_step())
    log.close()
    manager.shutdown(wait=False)


if __name__ == "__main__":
    main()
