"""The WAN bench's jobs by name (``--job mlp|lm``): the digits MLP (``geomx.bench.wan_job``) and the character LM
(``geomx.bench.wan_lm``), kept apart from both so that neither imports the other.

Usage::

    job("lm").make_model()
"""

from __future__ import annotations

from .wan_job import MLP, Job
from .wan_lm import LM

JOBS_BY_NAME: dict[str, Job] = {MLP.name: MLP, LM.name: LM}
JOBS = tuple(JOBS_BY_NAME)


def job(name: str) -> Job:
    """The job called ``name``; ValueError lists the valid names."""
    try:
        return JOBS_BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown WAN job {name!r}: choose one of {', '.join(JOBS)}") from None
