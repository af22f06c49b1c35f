"""geomx: a hierarchical parameter server for training one PyTorch model across data centers.

``geomx.kv`` and ``geomx.optim`` load on first use, so the scheduler processes never import torch.

The root holds the public faces: ``kv`` (the KVStore API), ``optim`` (the server optimizers), ``cli`` (the
``geomx`` command), ``launch`` (a topology's processes, started and watched), ``node`` (the schedulers' and
servers' entry point). Below them one folder per layer, top to bottom: ``bench``, ``torch`` (the PyTorch front
end), ``server`` and ``worker``, ``algorithms``, ``collective`` (a party's ranks as one process group), ``core``,
``cluster``, ``transport`` and ``codecs``, ``runs`` (run files, reports), ``protocol``, ``config`` and ``zoo``
(the examples' models and data).

Usage::

    import geomx
    kv = geomx.kv.create("dist_sync")
    kv.set_optimizer(geomx.optim.Adam(lr=1e-3))"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # type checkers see the submodules; at run time they load on first use
    from . import kv, optim

__all__ = ["kv", "optim"]
__version__ = "0.1.0"


def __getattr__(name: str) -> ModuleType:
    if name in __all__:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'geomx' has no attribute {name!r}")
