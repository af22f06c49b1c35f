"""One try of the quality bench's settings: an HFA row of your own (H and the topology's ``training`` block) at the
section's budget, so that a choice of the table's rows (DiLoCo's outer step, a codec's ablation) is made by runs
anyone can repeat, not by editing the rows.

Prints one JSON line (the row's final validation loss, bytes per parameter per outer step, wall seconds, and its
curve every 300 steps) and appends it to ``--log``. The row's files go under ``--out`` as the section's do.

Usage::

    PYTHONPATH=src python scripts/quality_try.py nest07m05 5 5 \\
        '{"server_optimizer": {"type": "outer_nesterov", "lr": 0.7, "momentum": 0.5}}'
    PYTHONPATH=src python scripts/quality_try.py s2b_h5 5 1 '{"server_optimizer": {"type": "outer_nesterov",
        "lr": 1.0, "momentum": 0.0}, "compression": {"type": "sparse2bit", "density": 0.02, "pull_density": 0.04}}'
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from geomx.bench import quality


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", help="the try's name (its files: OUT/*/quality-NAME*)")
    parser.add_argument("k1", type=int)
    parser.add_argument("k2", type=int, help="H = K1 x K2 (a divisor of the budget's eval_every, 100)")
    parser.add_argument("training", help="the topology's training block, as JSON")
    parser.add_argument("--out", default="bench-results/tries")
    parser.add_argument("--log", default="bench-results/tries/log.jsonl")
    args = parser.parse_args()
    budget = replace(quality.BUDGET, hfa=(args.k1, args.k2))
    row = quality.QualityRow(args.name, training=json.loads(args.training), hfa=True)
    params = quality.parameters(budget.preset)
    record = quality.measure_row(row, budget, Path(args.out), params, quality.python_command)
    curve = [(p["step"], round(p["val_loss"], 4)) for p in record["curve"] if p["step"] % 300 == 0]
    line = json.dumps({"name": args.name, "H": budget.outer_every, "training": row.training,
                       "val_loss": record["val_loss"], "bytes_per_param": record["bytes_per_param"],
                       "wall_s": record["wall_s"], "curve": curve})
    print(line)
    Path(args.log).parent.mkdir(parents=True, exist_ok=True)
    with open(args.log, "a") as log:
        log.write(line + "\n")


if __name__ == "__main__":
    main()
