"""Progress bars for long loops: tqdm on a terminal, silent when the output is a pipe or a file.

Under ``geomx launch`` every worker's output is a pipe, so bars stay off there; run a script by hand on a
terminal to see them. Pass ``enabled`` to force them on or off.

Usage::

    for batch in gx.progress(loader, desc="epoch 1"): ...
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

from tqdm import tqdm

T = TypeVar("T")


def progress(iterable: Iterable[T], *, desc: str | None = None, total: int | None = None,
             enabled: bool | None = None) -> Iterator[T]:
    """``iterable`` with a progress bar on stderr when it is a terminal (or when ``enabled``)."""
    show = sys.stderr.isatty() if enabled is None else enabled
    return iter(tqdm(iterable, desc=desc, total=total, disable=not show, leave=False, dynamic_ncols=True))
