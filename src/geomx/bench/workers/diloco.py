"""Bench peer: the WAN job (``geomx.bench.wan.job``) under torchft's DiLoCo: four replica groups of one rank each,
or (``--group-size 2``) two replica groups of two ranks each, FSDP2 inside each group as torchtitan runs it.

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

Replica groups of several ranks (``--group-size 2 --replica-group G``): each data center's two ranks are one
replica group, started as torchrun starts a job (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE=2``, ``MASTER_ADDR`` and
``MASTER_PORT`` of the group's store, inside its namespace; ``geomx bench`` sets them; the lighthouse then waits
for 2 replicas)::

    RANK=1 LOCAL_RANK=1 WORLD_SIZE=2 MASTER_ADDR=10.250.1.2 MASTER_PORT=29511 \\
        python -m geomx.bench.workers.diloco --group-size 2 --replica-group 1 --host 10.250.1.2 ...

The group's ranks form a gloo process group (the store at ``MASTER_ADDR:MASTER_PORT`` is also the Manager's);
the model is wrapped by ``fully_shard`` over it (FSDP2 as torchtitan applies it: each transformer block, or
each layer of the MLP, then the root), so each rank holds half of every parameter as a DTensor, and DiLoCo
all-reduces each rank's half of the pseudo-gradient with the same rank of the other group (torchft takes the
DTensors' local shards). Rank r of group G reads the data shard of rank ``G * 2 + r`` of the four-rank rows: a
group trains on the union of its ranks' shards, the job on the same data as every other row. For evaluation
only, the ranks of group 0 gather the global model's shards (``full_tensor()``, off rank 0's clock); rank 0
evaluates.
"""

from __future__ import annotations

import argparse
import datetime
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from geomx.bench.wan import job as wan_job
from geomx.bench.wan import jobs as wan_jobs


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rank", type=int, help="group size 1: the replica group and its data shard")
    parser.add_argument("--world", type=int, default=wan_job.WORLD, help="ranks of the job (its data shards)")
    parser.add_argument("--group-size", type=int, default=1, help="ranks per replica group (FSDP2 inside)")
    parser.add_argument("--replica-group", type=int, help="group size > 1: this group (RANK etc. from the env)")
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


@dataclass(frozen=True)
class Placement:
    """Where one process sits in the DiLoCo job: its replica group, its rank inside the group (torchrun's
    ``RANK``), the group's size, and the job's size in ranks (data shards).

    Usage: ``Placement(replica=1, group_rank=0, group_size=2).data_rank`` -> 2 (the 4-rank rows' rank 2)
    """

    replica: int
    group_rank: int = 0
    group_size: int = 1
    world: int = wan_job.WORLD

    @property
    def data_rank(self) -> int:
        """The shard (and batch order) this rank reads: the four-rank rows' rank at the same place."""
        return self.replica * self.group_size + self.group_rank

    @property
    def replicas(self) -> int:
        """How many replica groups the job has: the lighthouse's and the Manager's minimum."""
        return self.world // self.group_size

    @property
    def evaluates(self) -> bool:
        """Whether this rank takes part in evaluating the job's model (group 0: its ranks gather the shards)."""
        return self.replica == 0

    @property
    def logs(self) -> bool:
        return self.data_rank == 0


def placement_of(args: argparse.Namespace, env: Mapping[str, str]) -> Placement:
    """This process's place from its arguments and, in a group of several ranks, torchrun's variables;
    SystemExit says what is missing or inconsistent."""
    if args.world % args.group_size:
        raise SystemExit(f"--group-size {args.group_size} does not divide --world {args.world}")
    if args.group_size == 1:
        if args.rank is None:
            raise SystemExit("--rank is needed with --group-size 1")
        return Placement(args.rank, 0, 1, args.world)
    missing = [name for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if name not in env]
    if missing or args.replica_group is None:
        raise SystemExit(f"--group-size {args.group_size} runs as torchrun starts it: needs --replica-group and "
                         f"the variables {', '.join(missing) or '(all set)'}")
    if int(env["WORLD_SIZE"]) != args.group_size:
        raise SystemExit(f"WORLD_SIZE={env['WORLD_SIZE']} is not --group-size {args.group_size}")
    return Placement(args.replica_group, int(env["RANK"]), args.group_size, args.world)


def fsdp_units(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules FSDP2 wraps before the root, as torchtitan does: each transformer block (an element of a
    ``ModuleList`` child); a model without blocks (the MLP): each child that holds parameters."""
    blocks = [m for child in model.children() if isinstance(child, torch.nn.ModuleList) for m in child]
    if blocks:
        return blocks
    return [child for child in model.children() if any(True for _ in child.parameters())]


def shard_model(model: torch.nn.Module, group_size: int) -> torch.nn.Module:
    """``model`` under FSDP2 over the default (the replica group's gloo) process group: every parameter a DTensor
    of which this rank holds one shard."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (group_size,))
    for unit in fsdp_units(model):
        fully_shard(unit, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


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
    model its last outer step made; private to torchft 0.2.0, read only here). Under FSDP those are this rank's
    shards: the group gathers the whole of each (``full_tensor()``, a collective every rank of the group calls)."""
    from torch.distributed.tensor import DTensor

    names = {id(p): name for name, p in model.named_parameters()}
    target = dict(into.named_parameters())
    with torch.no_grad():
        for fragment in diloco._fragments:
            for name, param in fragment._model_fragment.named_parameters():
                value = fragment.original_parameters[name]
                if isinstance(param, DTensor):
                    value = DTensor.from_local(value, param.device_mesh, param.placements, shape=param.shape,
                                               stride=param.stride()).full_tensor()
                target[names[id(param)]].copy_(value)


def group_store(place: Placement, host: str, timeout: datetime.timedelta) -> tuple[str, int, Any]:
    """The replica group's store (address, port, the store object to keep alive). One rank: this process hosts
    it (port 0: the OS picks). Several: torchrun's, at ``MASTER_ADDR:MASTER_PORT``, which the group's gloo
    process group (``env://``) starts on its rank 0."""
    if place.group_size == 1:
        store = dist.TCPStore(host, 0, 1, is_master=True, timeout=timeout, wait_for_workers=False)
        return host, int(store.port), store
    dist.init_process_group("gloo", timeout=timeout)
    return os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), None


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    place = placement_of(args, os.environ)
    from torchft import Manager, ProcessGroupGloo
    from torchft.local_sgd import DiLoCo

    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=args.timeout_s)
    store_addr, store_port, _store = group_store(place, args.host, timeout)
    job = wan_jobs.job(args.job)
    calibrated = job.calibrate_step_s()
    model = job.make_model()
    if place.group_size > 1:
        model = shard_model(model, place.group_size)
    inner = job.make_optimizer(model.parameters(), False)
    # replica ids end in digits: torchft reads a global rank from them
    replica_id = f"rank{place.replica}" if place.group_size == 1 else f"group{place.replica}"
    manager = Manager(pg=ProcessGroupGloo(timeout=timeout), load_state_dict=None, state_dict=None,
                      min_replica_size=place.replicas, use_async_quorum=False, timeout=timeout,
                      quorum_timeout=timeout, connect_timeout=timeout, rank=place.group_rank,
                      world_size=place.group_size, store_addr=store_addr, store_port=store_port,
                      lighthouse_addr=args.lighthouse, replica_id=replica_id, hostname=args.host, init_sync=False)
    shard, test, steps = job.shard_and_test(place.data_rank, args.world)
    timer = wan_job.ComputeTimer()

    def evaluate(diloco: DiLoCo) -> float:
        load_global_model(diloco, model, held)
        return job.evaluate(held, test) if place.logs else 0.0

    # the clock starts where DDP's and geomx's do, with every rank joined: after a first quorum (the lighthouse's
    # rendezvous and the gloo group's set-up), which DiLoCo would otherwise run inside the first timed steps
    manager.start_quorum()
    manager.wait_quorum()
    system = f"diloco_h{args.sync_every}" + (f"_groups{place.group_size}" if place.group_size > 1 else "")
    log = wan_job.JobLog(args.log, place.data_rank, system, job.metric)
    step = 0
    fragments = fragments_of(model, args.fragments) if args.fragments > 1 else [model]
    outer = [torch.optim.SGD(fragment.parameters(), lr=wan_job.OUTER_LR, momentum=wan_job.OUTER_MOMENTUM,
                             nesterov=True) for fragment in fragments]  # one outer optimizer per fragment
    held = job.make_model()  # evaluated: the job's model
    every = args.sync_every // len(fragments)  # a fragment's outer step every this many steps
    with DiLoCo(manager, fragments, inner, outer, sync_every=args.sync_every,
                fragment_sync_delay=args.fragment_sync_delay, fragment_update_alpha=args.fragment_alpha) as diloco:
        for epoch, images, labels in wan_job.batches(shard, place.data_rank, args.epochs, steps):
            with timer("forward"):
                inner.zero_grad()
                loss = job.loss_of(model, images, labels)
            with timer("backward"):
                loss.backward()  # FSDP2: the group's reduce-scatter runs inside
            synced = (step + 1) % every == 0
            if synced:
                inner.step()  # the outer round (all-reduce + outer Nesterov) runs in the step hook: not compute
            else:
                with timer("optimizer"):
                    inner.step()
            step += 1
            if place.evaluates and step % args.sync_every == 0:
                value = log.evaluate(lambda: evaluate(diloco))  # the gather, off the clock of rank 0
                if place.logs:
                    log.write(step=step, epoch=epoch, value=value, compute=timer, loss=float(loss.detach()),
                              calibrated_step_s=calibrated, manager_step=manager.current_step())
    log.close()
    manager.shutdown(wait=False)
    if place.group_size > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
