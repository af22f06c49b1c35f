"""The WAN bench's jobs by name (``--job mlp|lm``): the digits MLP (``geomx.bench.wan.job``) and the character LM
(``geomx.bench.wan.lm``), kept apart from both so that neither imports the other.

Usage::

    job("lm").make_model()
"""

from __future__ import annotations

import argparse

from .job import MLP, Job
from .lm import LM

JOBS_BY_NAME: dict[str, Job] = {MLP.name: MLP, LM.name: LM}
JOBS = tuple(JOBS_BY_NAME)


def geomx_worker_parser(description: str | None) -> argparse.ArgumentParser:
    """The arguments every geomx bench worker of the WAN job takes (the kvstore loop's and the wrapper's)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--log-dir", required=True, help="folder for rank<global rank>.jsonl")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--eval-every", type=int, default=5, help="FSA: evaluate every N steps")
    parser.add_argument("--job", choices=JOBS, default="mlp", help="the model, data and evaluation")
    return parser


def job(name: str) -> Job:
    """The job called ``name``; ValueError lists the valid names."""
    try:
        return JOBS_BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown WAN job {name!r}: choose one of {', '.join(JOBS)}") from None
