"""Integration worker: a plain kvstore loop that never calls ``close`` (the kvstore's exit hook leaves the job), in
which one worker may stop mid-run without raising.

``--fault exit --code N``: the worker of global rank ``--rank`` calls ``sys.exit(N)`` at step ``--step`` (a script
quitting on NaN; N = 0: one that ends early on purpose). ``--fault hang``: it waits there until the launcher ends it.
``--fault none``: every worker trains ``--steps`` steps; ``--linger-rank`` stays ``--linger`` s longer before its
script ends (the others' goodbyes come first). The faulty worker writes ``$RUN/out/stop.json`` (when it stopped).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time

import jobkit
import torch

import geomx


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fault", choices=["none", "exit", "hang"], default="none")
    parser.add_argument("--code", type=int, default=3)
    parser.add_argument("--rank", type=int, default=1)
    parser.add_argument("--step", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--linger-rank", type=int, default=-1)
    parser.add_argument("--linger", type=float, default=1.5)
    args = parser.parse_args()
    kv = geomx.kv.create("dist_sync")
    rank = kv.global_rank
    weights = [torch.zeros(64), torch.zeros(8)]
    kv.init([0, 1], weights)
    for step in range(args.steps):
        if args.fault != "none" and rank == args.rank and step == args.step:
            stopped = {"time": time.time(), "fault": args.fault}
            (jobkit.out_dir(kv.config.run_dir) / "stop.json").write_text(json.dumps(stopped))
            if args.fault == "exit":
                sys.exit(args.code)
            threading.Event().wait(600.0)  # the hang under test: the launcher ends this process long before
        for key, weight in enumerate(weights):
            kv.push(key, torch.full_like(weight, float(rank + 1)), priority=-key)
        for key, weight in enumerate(weights):
            kv.pull(key, weight, priority=-key)
    if rank == args.linger_rank:
        time.sleep(args.linger)  # the late finisher under test, not a synchronization
    print(f"trained {args.steps} steps", flush=True)  # no kv.close(): the exit hook leaves the job


if __name__ == "__main__":
    main()
