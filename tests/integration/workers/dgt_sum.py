"""Integration worker for DGT: push known tensors for a few rounds, pull the global sum, save both.

No server optimizer: the global server answers with the sum of the parties' (reassembled) pushes. The
pushed values differ per block (so contributions rank them), per round and per worker.
"""

from __future__ import annotations

import argparse

import jobkit
import torch

import geomx


def pushed(rank: int, rnd: int, numel: int) -> torch.Tensor:
    index = torch.arange(numel, dtype=torch.float32)
    return ((index % 97) + 1.0) * 0.01 * (rank + 1) + rnd * 0.5 + torch.sin(index * (rnd + 1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--numel", type=int, default=8192)
    args = parser.parse_args()
    kv = geomx.kv.create("dist_sync")
    rank = kv.global_rank
    kv.init(0, torch.zeros(args.numel))
    pulls = []
    for rnd in range(args.rounds):
        out = torch.empty(args.numel)
        kv.push(0, pushed(rank, rnd, args.numel))
        kv.pull(0, out)
        pulls.append(out)
    wan_bytes = kv.wan_bytes()  # after the last pull: every push (and its UDP blocks) reached the global server
    kv.record(rounds=args.rounds, wan_mb=wan_bytes / 1e6)  # what `geomx report` shows in its WAN column
    jobkit.save_worker_output(kv.config.run_dir, rank, {"pulls": pulls}, {"rounds": args.rounds,
                                                                         "wan_bytes": wan_bytes})
    kv.close()


if __name__ == "__main__":
    jobkit.run_and_exit(main)
