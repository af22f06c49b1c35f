"""Bench worker of ``geomx bench --only quality``: the zoo's character transformer on the standard library's text,
one loop for every row, so that rows differ only in how the ranks agree on a model.

Three ways to run it (``geomx.bench.quality`` starts them)::

    python -m geomx.bench.workers.quality --mode single --out curve.jsonl            # one process, the global batch
    python -m torch.distributed.run --standalone --nproc-per-node 4 \\
        -m geomx.bench.workers.quality --mode ddp --out curve.jsonl                 # torch DDP over gloo
    geomx launch job.yaml -- python -m geomx.bench.workers.quality --mode geomx --out curve.jsonl

Every row reads the same global batches in the same order: step ``s`` takes the windows ``order[s*G:(s+1)*G]`` of
one seeded permutation of the training windows per epoch (``G``: ``--batch-size`` x ``--world``), and rank ``r``
of ``--world`` takes the ``r``-th of ``--world`` equal parts of it (``single`` takes all of it). The model starts from
the same seed everywhere, and every rank's rate follows the same schedule (``--schedule``). The process that holds
the job's model (single: itself; DDP: rank 0; geomx: the master worker, through ``opt.load_job_model``) evaluates
it on the same ``--eval-windows`` validation windows (spread evenly over the held-out text) every ``--eval-every``
steps and at step 0, and writes one JSON line per evaluation to ``--out``:
``{"step", "tokens", "val_loss", "accuracy", "elapsed_s"}`` (tokens: the whole job's training tokens so far).
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset, Subset

from geomx.zoo.charlm import VOCAB, CharTransformer, Windows, build, encode, evaluate, stdlib_text


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=("single", "ddp", "geomx"), required=True)
    parser.add_argument("--out", required=True, help="JSON lines of the evaluations (written by one process)")
    parser.add_argument("--preset", default="tiny", help="a shape of geomx.zoo.charlm.PRESETS")
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--batch-size", type=int, default=16, help="windows per rank per step")
    parser.add_argument("--world", type=int, default=4, help="ranks of the distributed rows (single: its batch)")
    parser.add_argument("--optimizer", choices=("adamw", "adam", "sgd", "frozen_adamw"), default="adamw")
    parser.add_argument("--freeze-after", type=int, default=60, help="frozen_adamw: the steps before the freeze")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--schedule", choices=("cosine", "constant"), default="cosine",
                        help="cosine: from --lr to a tenth of it over --steps (constant: where the servers step)")
    parser.add_argument("--weight-decay", type=float, default=0.01, help="AdamW's")
    parser.add_argument("--max-chars", type=int, default=1_000_000)
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--eval-windows", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout-s", type=float, default=600.0)
    return parser.parse_args(argv)


def texts(max_chars: int, context: int, eval_windows: int) -> tuple[Windows, Subset[tuple[torch.Tensor, torch.Tensor]]]:
    """The training windows (the first 90% of the text) and ``eval_windows`` validation windows spread evenly over
    the rest (the held-out files, not the first of them alone)."""
    ids = encode(stdlib_text(max_chars))
    cut = int(len(ids) * 0.9)
    held = Windows(ids[cut:], context)
    stride = max(1, len(held) // eval_windows)
    return Windows(ids[:cut], context), Subset(held, list(range(0, len(held), stride))[:eval_windows])


def learning_rate(args: argparse.Namespace, step: int) -> float:
    """Step ``step``'s (0-based) rate: cosine from ``--lr`` to a tenth of it, or ``--lr`` throughout."""
    if args.schedule == "constant":
        return float(args.lr)
    return float(args.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * step / args.steps))))


def global_batches(count: int, global_batch: int, steps: int, seed: int) -> Iterator[torch.Tensor]:
    """The window indices of each step's global batch: a fresh seeded permutation of ``count`` windows per epoch,
    cut into ``global_batch`` consecutive indices (a partial batch at an epoch's end is dropped)."""
    per_epoch = count // global_batch
    if per_epoch < 1:
        raise SystemExit(f"{count} training windows cannot make one global batch of {global_batch}")
    step, epoch = 0, 0
    while step < steps:
        order = torch.randperm(count, generator=torch.Generator().manual_seed(seed + epoch))
        for index in range(per_epoch):
            if step == steps:
                return
            yield order[index * global_batch:(index + 1) * global_batch]
            step += 1
        epoch += 1


def rank_part(batch: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """Rank ``rank``'s equal part of a global batch (``world`` 1: the whole of it)."""
    size = len(batch) // world
    return batch[rank * size:(rank + 1) * size]


def make_optimizer(args: argparse.Namespace, model: torch.nn.Module) -> torch.optim.Optimizer:
    """AdamW (every row's), Adam where the global servers must run it (MixedSync, SSP: only Adam translates), plain
    SGD (a try: what a codec costs without Adam's per-coordinate scaling), or AdamW whose variance freezes after
    ``--freeze-after`` steps (``geomx.torch.FrozenVarianceAdam``: Adam under a sparse codec)."""
    if args.optimizer == "frozen_adamw":
        from geomx.torch import FrozenVarianceAdam

        return FrozenVarianceAdam(model.parameters(), lr=args.lr, weight_decay=args.weight_decay,
                                  decoupled_weight_decay=True, freeze_after=args.freeze_after)
    if args.optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=args.lr)
    if args.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=args.lr)
    return torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)


class Curve:
    """The evaluations' JSON lines file, written by the one process that evaluates."""

    def __init__(self, path: str, val: Dataset[tuple[torch.Tensor, torch.Tensor]], windows: int,
                 tokens_per_step: int) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.file = open(self.path, "w")  # noqa: SIM115 (open for the whole run, closed by close())
        self.val, self.batches = val, max(1, windows // 64)
        self.tokens_per_step = tokens_per_step
        self.started = time.monotonic()

    def write(self, model: torch.nn.Module, step: int) -> float:
        val_loss, accuracy = evaluate(model, self.val, self.batches, 64)
        record = {"step": step, "tokens": step * self.tokens_per_step, "val_loss": val_loss, "accuracy": accuracy,
                  "elapsed_s": time.monotonic() - self.started}
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        print(f"step {step}  val loss {val_loss:.4f}", flush=True)
        return val_loss

    def close(self) -> None:
        self.file.close()


def train(args: argparse.Namespace, model: torch.nn.Module, train_windows: Windows, rank: int, world: int,
          step_fn: Callable[[torch.Tensor], None], curve: Curve | None,
          job_model: Callable[[], torch.nn.Module], optimizer: torch.optim.Optimizer) -> None:
    """The shared loop: each step's part of the global batch, the step's rate, one optimizer step, an evaluation
    when due.

    ``step_fn(loss)``: backward and the step; ``job_model()``: the model to evaluate (called on every rank: under
    geomx only the master evaluates, but every rank keeps the same loop)."""
    inputs, targets = train_windows.tensors()
    global_batch = args.batch_size * args.world
    for step, batch in enumerate(global_batches(len(train_windows), global_batch, args.steps, args.seed), 1):
        mine = rank_part(batch, rank, world)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(args, step - 1)
        loss = F.cross_entropy(model(inputs[mine]).reshape(-1, VOCAB), targets[mine].reshape(-1))
        step_fn(loss)
        if step % args.eval_every == 0 or step == args.steps:
            held = job_model()
            if curve is not None:
                curve.write(held, step)


def prepare(args: argparse.Namespace) -> tuple[Windows, Subset[tuple[torch.Tensor, torch.Tensor]], CharTransformer]:
    """One core per process, the text's training and validation windows, and the model from the seed: how every
    bench worker on this text starts (``chaos`` too)."""
    torch.set_num_threads(1)
    train_windows, val = texts(args.max_chars, build(args.preset).position.num_embeddings, args.eval_windows)
    torch.manual_seed(args.seed)
    return train_windows, val, build(args.preset)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    train_windows, val, model = prepare(args)
    tokens_per_step = args.batch_size * args.world * model.position.num_embeddings
    if args.mode == "single":
        optimizer = make_optimizer(args, model)
        curve = Curve(args.out, val, args.eval_windows, tokens_per_step)
        curve.write(model, 0)

        def single_step(loss: torch.Tensor) -> None:
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

        train(args, model, train_windows, 0, 1, single_step, curve, lambda: model, optimizer)
        curve.close()
    elif args.mode == "ddp":
        run_ddp(args, model, train_windows, val, tokens_per_step)
    else:
        run_geomx(args, model, train_windows, val, tokens_per_step)


Held = Dataset[tuple[torch.Tensor, torch.Tensor]]


def run_ddp(args: argparse.Namespace, model: CharTransformer, train_windows: Windows, val: Held,
            tokens_per_step: int) -> None:
    """DDP over gloo, started by torchrun (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from geomx.bench.workers.teardown import leave_process_group

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != args.world:
        raise SystemExit(f"torchrun started {world} ranks, --world says {args.world}")
    ddp = DistributedDataParallel(model)
    optimizer = make_optimizer(args, ddp)
    curve = Curve(args.out, val, args.eval_windows, tokens_per_step) if rank == 0 else None
    if curve is not None:
        curve.write(model, 0)

    def ddp_step(loss: torch.Tensor) -> None:
        optimizer.zero_grad()
        loss.backward()  # DDP's all-reduce runs inside
        optimizer.step()

    train(args, ddp, train_windows, rank, world, ddp_step, curve, lambda: model, optimizer)
    if curve is not None:
        curve.close()
    leave_process_group()


def run_geomx(args: argparse.Namespace, model: CharTransformer, train_windows: Windows, val: Held,
              tokens_per_step: int) -> None:
    """Through the PyTorch wrapper: the algorithm, codec and LAN tier come from the topology ``geomx launch`` got."""
    import geomx.torch as gx

    inner = make_optimizer(args, model)
    opt = gx.DistributedOptimizer(inner, model)
    rank, world = opt.global_rank, args.world
    held = copy.deepcopy(model)
    curve = Curve(args.out, val, args.eval_windows, tokens_per_step) if opt.is_master_worker else None
    if curve is not None:
        curve.write(model, 0)  # the starting point, which every worker now holds

    def geomx_step(loss: torch.Tensor) -> None:
        opt.zero_grad()
        loss.backward()
        opt.step()
        opt.log(loss=loss)

    def job_model() -> torch.nn.Module:
        if opt.is_master_worker:
            opt.load_job_model(held)  # under HFA / streaming: the global model as the party holds it
        return held

    train(args, model, train_windows, rank, world, geomx_step, curve, job_model, inner)
    if curve is not None:
        curve.close()
    opt.close()


if __name__ == "__main__":
    main()
