r"""A small character-level transformer language model, trained across data centers with the PyTorch wrapper.

The text is the Python standard library's own source code, found at run time through ``sysconfig``:
nothing is downloaded. The loop is a plain PyTorch loop; the lines marked ``# geomx`` are all it takes.
The algorithm comes from the topology (or GEOMX_* variables), not from this file:

    geomx launch topologies/demo.yaml --run-dir runs/lm-fsa -- python examples/lm.py          # FSA
    geomx launch topologies/lm_hfa.yaml --run-dir runs/lm-hfa -- python examples/lm.py        # HFA + outer
    geomx report runs/lm-fsa runs/lm-hfa --out report/lm
    # on GPUs, GPT-2 small's blocks, 85M parameters (each rank on the GPU of its LOCAL_RANK), in bfloat16, the WAN
    # carrying bfloat16 too (docs/pytorch.md, "Models in bfloat16"):
    GEOMX_COMPRESSION=bf16 geomx launch job.yaml -- \
        python examples/lm.py --device cuda --preset gpt85m --dtype bfloat16
    # float16 autocast and a GradScaler (the optimizer on the workers; docs/pytorch.md, "Mixed precision"):
    GEOMX_SERVER_OPTIMIZER=none geomx launch topologies/demo.yaml -- python examples/lm.py --amp --clip 1.0
    # Bi-Sparse 1% on the WAN with Adam: the codec's warm-up and Adam's variance frozen early in it
    # (docs/compression.md, "Which one should I use")
    GEOMX_COMPRESSION=bsc:threshold=0.01,warmup_steps=150,size_lower_bound=0 geomx launch topologies/demo.yaml -- \
        python examples/lm.py --freeze-variance 25

``--preset`` names a shape of ``geomx.zoo.charlm.PRESETS`` (tiny, gpt57m, gpt85m, gpt43m) and sets --context, --dim,
--layers, --heads and --ff; without it those flags keep their defaults (tiny's shape) and can be set one by one.

The master worker evaluates the job's model on held-out text every ``--eval-every`` steps and logs
``val_loss`` and the next-character ``accuracy``; every worker logs its training loss. Under FSA every worker
holds the job's model; under HFA a worker's own model between global rounds is its party's, so the master
evaluates the global model as its party's local server holds it (``opt.load_job_model``, no WAN).
"""

from __future__ import annotations

import argparse
import copy
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

import geomx.torch as gx

# the model, its named shapes and its text
from geomx.zoo.charlm import PRESETS, VOCAB, CharTransformer, Windows, encode, evaluate, stdlib_text


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--preset", choices=list(PRESETS),
                        help="a named model shape: sets --context, --dim, --layers, --heads and --ff")
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--ff", type=int, default=2, help="feed-forward width as a multiple of --dim")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--freeze-variance", type=int, default=None, metavar="STEPS",
                        help="Adam's variance frozen after STEPS steps (gx.FrozenVarianceAdam): for a sparse WAN codec")
    parser.add_argument("--clip", type=float, default=None, help="clip the gradients to this norm before each step")
    parser.add_argument("--max-chars", type=int, default=1_000_000)
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--eval-batches", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="cuda: each rank on the GPU of its LOCAL_RANK")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                        help="the model's parameters (bfloat16: the servers keep a float32 copy)")
    parser.add_argument("--amp", action="store_true", help="mixed precision: the forward under torch.autocast in "
                        "float16, the loss scaled by a torch.amp.GradScaler (the optimizer on the workers: "
                        "GEOMX_SERVER_OPTIMIZER=none under FSA)")
    args = parser.parse_args()
    if args.preset is not None:
        shape = PRESETS[args.preset]
        args.context, args.dim, args.layers, args.heads, args.ff = (shape.context, shape.dim, shape.layers,
                                                                    shape.heads, shape.ff)
    return args


def pick_device(name: str) -> torch.device:
    """``cpu``, or this rank's GPU: ``LOCAL_RANK`` (set by geomx launch and torchrun) modulo the GPUs."""
    if name != "cuda":
        return torch.device(name)
    if not torch.cuda.is_available():  # one line, where the modulo below would raise ZeroDivisionError on every rank
        raise SystemExit("lm.py: --device cuda, but torch sees no CUDA device here (torch.cuda.is_available() is "
                         "False): run with --device cpu")
    index = gx.local_rank() % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def main() -> None:
    args = parse_args()
    ids = encode(stdlib_text(args.max_chars))
    cut = int(len(ids) * 0.9)
    train_windows, val = Windows(ids[:cut], args.context), Windows(ids[cut:], args.context)
    torch.manual_seed(args.seed)
    device = pick_device(args.device)
    model = CharTransformer(args.context, args.dim, args.layers, args.heads, ff=args.ff)
    model.to(device, getattr(torch, args.dtype))

    train = gx.shard(train_windows, seed=args.seed)  # geomx: this worker's part of the text
    adam = (torch.optim.Adam(model.parameters(), lr=args.lr) if args.freeze_variance is None
            else gx.FrozenVarianceAdam(model.parameters(), lr=args.lr, freeze_after=args.freeze_variance))
    opt = gx.DistributedOptimizer(adam, model)  # geomx
    loader = DataLoader(train, batch_size=args.batch_size, shuffle=True, drop_last=True,
                        generator=torch.Generator().manual_seed(args.seed + opt.global_rank))
    scaler = torch.amp.GradScaler(device.type) if args.amp else None
    step, started = 0, time.monotonic()
    job_model = copy.deepcopy(model)  # what the master evaluates: the job's model, not its own
    if opt.is_master_worker:  # the starting point (the master's initial weights, which every worker now holds)
        val_loss, accuracy = evaluate(model, val, args.eval_batches, args.batch_size)
        opt.log(val_loss=val_loss, accuracy=accuracy)
        print(f"step 0  val loss {val_loss:.3f}  val accuracy {accuracy:.3f}", flush=True)
    while step < args.steps:
        for x, y in gx.progress(loader, desc=f"step {step}"):
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            opt.zero_grad()
            with torch.autocast(device.type, dtype=torch.float16, enabled=args.amp):
                loss = F.cross_entropy(model(x).float().reshape(-1, VOCAB), y.reshape(-1))
            (loss if scaler is None else scaler.scale(loss)).backward()
            if args.clip or scaler is not None:
                opt.average_gradients()  # geomx: the gradients step() applies, now, for the clip and the scaler
            if scaler is not None and args.clip:
                scaler.unscale_(opt)
            if args.clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            if scaler is None:
                opt.step()
            else:  # skips the update where the scaled gradients overflowed, alike on every worker
                scaler.step(opt)
                scaler.update()
            opt.log(loss=loss)  # geomx: the loss in the run's metrics
            step += 1
            if opt.is_master_worker and (step % args.eval_every == 0 or step == args.steps):
                opt.load_job_model(job_model)  # geomx (optional): under HFA, the global model
                val_loss, accuracy = evaluate(job_model, val, args.eval_batches, args.batch_size)
                opt.log(val_loss=val_loss, accuracy=accuracy)
                print(f"step {step}  train loss {loss.item():.3f}  val loss {val_loss:.3f}  "
                      f"val accuracy {accuracy:.3f}  elapsed {time.monotonic() - started:.1f} s", flush=True)
            if step >= args.steps:
                break
    opt.close()  # geomx: the last updates land, the worker leaves the job


if __name__ == "__main__":
    main()
