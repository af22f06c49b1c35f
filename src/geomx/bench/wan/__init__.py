"""The WAN section of ``geomx bench`` (``--only wan``): geomx against DDP, PyTorch's local SGD and torchft's
DiLoCo across a kernel-shaped link between two network namespaces.

``section`` (the section: its ``run`` and ``lines``, which ``run`` and ``lines`` here hand on, importing it only
then; ``__main__`` runs its ``main``: ``python -m geomx.bench.wan``), ``systems`` (the rows: each system and its
settings), ``runs`` (one system's run across the link, and its raw figures), ``goals`` (the goals, each said with
the figure measured), ``job`` (the digits MLP job every system trains, and its JSON-lines log), ``lm`` (the
character transformer job), ``jobs`` (the jobs by name), ``netns`` (the link: two namespaces joined by a veth
pair with ``tbf``). The processes they start are ``geomx.bench.workers``' ``ddp``, ``diloco``, ``wan_geomx`` and
``wan_torch``.

Usage::

    sudo .venv/bin/python -m geomx.bench.wan --job mlp --rates 100 20
    geomx bench --only wan --quick"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..sections import BenchPlan


def run(plan: BenchPlan, out_dir: Path) -> dict[str, Any]:
    """The section's entry point for ``geomx bench --only wan`` (``section.run``)."""
    from .section import run as run_section

    return run_section(plan, out_dir)


def lines(result: dict[str, Any]) -> list[str]:
    """The section's table for ``geomx bench``'s report (``section.lines``)."""
    from .section import lines as section_lines

    return section_lines(result)
