"""Bench worker of ``geomx bench --only scale``: the scale job's training loop on one rank, its inner steps either
the accelerator stand-in (a wait of ``--step-ms``; ``geomx.bench.standin``) or, with ``--real``, the real model's
forward, backward and AdamW step (on CUDA when ``--device cuda``).

``--sync geomx``: through ``gx.DistributedOptimizer`` (the algorithm, codec and links come from the topology);
``--sync none``: the same loop with no sync at all (the control: utilization 1 with the stand-in, and the memory
of plain PyTorch). Each rank writes ``--out/rank<R>.json``: every step's wall time (less the stand-in's own
overrun in it, and the landings' mixes into the model: device work, ``device_s``), the loop's wall time, its peak
resident memory and the model's bytes, and ``times``: when (wall clock) its start's stages ended (``main``: the
imports; ``model``: the model built; ``joined``: the kvstore joined the job, its party's group formed, ``setup``
before it: the stand-in's gradient and optimizer state made; ``ready``: the wrapper's INIT done, the job's model in
hand) and its loop began (``started_at``; ``step_ends`` count from there). ``--die-step`` kills the rank's whole
party at that step (``geomx.bench.recovery``).

Usage::

    geomx launch scale.yaml -- python -m geomx.bench.workers.scale_step --preset gpt85m --steps 300 --out DIR
    python -m geomx.bench.workers.scale_step --sync none --preset gpt85m --steps 50 --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import time
import zlib
from pathlib import Path

import torch

from geomx.bench.standin import StandIn, realistic_deltas
from geomx.bench.workers.chaos import kill_party, note_fault
from geomx.config import node_config
from geomx.runs.runlog import cpu_seconds, peak_rss_bytes
from geomx.zoo.charlm import Windows, build, encode, next_char_loss, stdlib_text

BATCH = 16  # the real step's batch (the stand-in's one gradient uses one window: its size is what counts)


def rss_bytes() -> int:
    """This process's resident memory now (Linux)."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _batch(preset_context: int, rank: int, size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``size`` windows of real text, different for each rank."""
    windows = Windows(encode(stdlib_text(200_000)), preset_context)
    inputs, targets = windows.tensors()
    start = (rank * size) % max(1, len(windows) - size)
    return inputs[start:start + size].to(device), targets[start:start + size].to(device)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="gpt85m")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--step-ms", type=float, default=40.0, help="the stand-in's inner step")
    parser.add_argument("--sync", choices=["geomx", "none"], default="geomx")
    parser.add_argument("--apply-every", type=int, default=0, help="steps between deltas (0: the job's K1)")
    parser.add_argument("--real", action="store_true", help="real forward, backward and AdamW instead of the wait")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--out", required=True, help="folder of the ranks' JSON files")
    parser.add_argument("--die-step", type=int, default=-1,
                        help="after this many steps, SIGKILL every process of this rank's party, itself last")
    parser.add_argument("--until-file", help="train until this file exists (looked for by the party's rank 0 at "
                        "each outer round's end), then --after steps more (at most --steps in all)")
    parser.add_argument("--after", type=int, default=0)
    parser.add_argument("--contributed-file", help="create this file when the first outer round is in")
    args = parser.parse_args(argv)
    times = {"main": time.time()}
    device = torch.device("cpu")
    if args.device == "cuda":
        from geomx.bench.workers.lan_step import share_gpu

        device = share_gpu()
    else:
        torch.set_num_threads(1)
    rank = int(os.environ.get("RANK", "0"))
    # the gradient's batch: one per party (a party's ranks hold one model, as DDP keeps them), one per rank alone
    source = zlib.crc32(node_config().party.encode()) if args.sync == "geomx" else rank
    torch.manual_seed(0)  # every rank the same model (the wrapper's init checks it)
    model = build(args.preset).to(device)
    stages = {"model": rss_bytes()}
    times["model"] = time.time()
    params = list(model.parameters())
    context = model.position.num_embeddings
    inputs, targets = _batch(context, source, BATCH if args.real else 1, device)
    inner = torch.optim.AdamW(params, lr=args.lr)
    deltas = realistic_deltas(params, lambda: next_char_loss(model, inputs, targets), args.lr)
    # the optimizer's state exists, as in a job past its first step (the memory a real job holds); at lr 0 the
    # weights stay the seed's, so every party still holds the master's model when the wrapper INITs it
    rates = [group["lr"] for group in inner.param_groups]
    for group in inner.param_groups:
        group["lr"] = 0.0
    inner.step()
    for group, rate in zip(inner.param_groups, rates, strict=True):
        group["lr"] = rate
    stages["training_state"] = rss_bytes()
    opt: torch.optim.Optimizer = inner
    k1 = 1
    kv, outer = None, 1
    if args.sync == "geomx":
        import geomx.torch as gx
        from geomx.kv import create
        from geomx.torch.plan import make_plan

        times["setup"] = time.time()  # the stand-in's gradient and optimizer state made
        config = node_config()  # the kvstore made here, so that joining the job and its INIT are timed apart
        kv = create(make_plan(config.topology.training, config.topology.hfa, inner).kvstore_type, config)
        times["joined"] = time.time()
        opt = gx.DistributedOptimizer(inner, model, kv=kv)
        times["ready"] = time.time()
        rank = opt.global_rank
        k1 = opt.kv.hfa.k1 if opt.kv.hfa is not None else 1  # FSA: no local rounds
        outer = k1 * opt.kv.hfa.k2 if opt.kv.hfa is not None else 1
        stages["wrapper"] = rss_bytes()
    # gradients every step (FSA): the wait, then the one real gradient pushed as backward's hooks would; what
    # leaves is the gradient, so the parameters need no delta (the optimizer's step is the device's, skipped)
    per_step = args.sync == "geomx" and opt.plan.mode.name != "HFA"  # type: ignore[attr-defined]
    stand_in = StandIn(params, deltas, args.step_ms / 1000,
                       args.apply_every or (None if per_step else k1))
    if args.sync == "geomx" and not args.real:  # the stand-in's change of the parameters takes the step's math's place
        opt.strategy.inner_step = (lambda: None) if per_step else stand_in.move  # type: ignore[attr-defined]
        if hasattr(opt.strategy, "mix"):  # a landing's mix: the device's work, on the host here (``on_device``)
            opt.strategy.mix = stand_in.on_device(opt.strategy.mix)  # type: ignore[attr-defined]
    durations, ends = [], []
    cpu_before = cpu_seconds()
    started_at, started = time.time(), time.perf_counter()
    last = args.steps
    for step in range(args.steps):
        if step == last:
            break
        if step == args.die_step and kv is not None:
            note_fault(args.out, step, rank)
            kill_party(kv.config.run_dir, kv.config.party)
        begun, left_out = time.perf_counter(), stand_in.left_out_s
        if args.real:
            opt.zero_grad()
            next_char_loss(model, inputs, targets).backward()
            opt.step()
            if device.type == "cuda":
                torch.cuda.synchronize()
        elif per_step:
            stand_in.step()
            opt.push_gradients()  # type: ignore[attr-defined]
            opt.step()
        elif args.sync == "geomx":  # forward and backward (the wait), then the optimizer's step (its sync included)
            stand_in.compute()
            opt.step()
        else:
            stand_in.step()
        # the stand-in's own work and the sync's device work on its host, out
        durations.append(time.perf_counter() - begun - (stand_in.left_out_s - left_out))
        ends.append(round(time.perf_counter() - started, 4))
        if (step + 1) % outer == 0:  # an outer round's end
            if args.contributed_file and step + 1 == outer:
                Path(args.contributed_file).write_text(repr(time.time()))
            if args.until_file and last == args.steps and party_sees(Path(args.until_file)):
                last = min(args.steps, step + 1 + args.after)
    wall = time.perf_counter() - started
    loop_cpu = {part: spent - cpu_before[part] for part, spent in cpu_seconds().items()}  # every thread's
    stages["loop"] = rss_bytes()
    result = {"rank": rank, "steps": len(durations), "step_s": args.step_ms / 1000, "wall_s": wall,
              "durations_s": durations, "overrun_s": stand_in.overrun_s, "device_s": stand_in.device_s, "k1": k1,
              "real": args.real,
              "params": sum(p.numel() for p in params),
              "model_bytes": sum(p.numel() * p.element_size() for p in params),
              "peak_rss_bytes": peak_rss_bytes(), "rss_bytes_after": stages,
              "loop_cpu_s": loop_cpu, "device": str(device), "times": times, "started_at": started_at,
              "step_ends": ends, "init_s": kv.init_s if kv is not None else 0.0}
    if kv is not None:
        opt.close()  # type: ignore[attr-defined]
        kv.close()
        result["peak_rss_bytes"] = peak_rss_bytes()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{rank}.json").write_text(json.dumps(result))


def party_sees(path: Path) -> bool:
    """Whether ``path`` exists, as the party's rank 0 sees it (broadcast to its other ranks, which must stop at the
    same step: a rank that left early would leave the others' collectives without a peer)."""
    seen = torch.tensor([float(path.exists())])
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.broadcast(seen, src=0)
    return bool(seen.item())


if __name__ == "__main__":
    main()
