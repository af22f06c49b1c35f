"""The training settings a checkpoint records and a resumed job must share.

A checkpoint's values and optimizer state mean something only under the plan that wrote them: the sync policy,
where the optimizer runs, the WAN codec, HFA's frequencies, ESync, P3. A checkpoint records them; a resume under
others is refused naming each difference (``geomx.core.checkpoints``, ``geomx.torch.checkpoint``).

Usage::

    saved = plan_settings(topology)                       # into the manifest
    settings_difference(saved, plan_settings(other))      # "sync: the checkpoint's 'dist_sync', this job's ..."
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .topology import Topology


def plan_settings(topology: Topology) -> dict[str, Any]:
    """The training settings of ``topology`` that a checkpoint records (JSON-ready)."""
    training = topology.training
    return {"mode": topology.mode.value, "sync": training.sync,
            "server_optimizer": training.server_optimizer,
            "server_optimizer_params": {name: value for name, value in training.server_optimizer_params},
            "compression": training.compression,
            "hfa": dataclasses.asdict(topology.hfa) if topology.hfa is not None else None,
            "esync": training.esync, "p3": training.p3}


def settings_difference(saved: dict[str, Any], current: dict[str, Any]) -> str | None:
    """What differs between a checkpoint's settings and this job's, named (None: nothing; an older checkpoint that
    recorded none is taken as it is)."""
    if not saved:
        return None
    changed = [f"{name}: the checkpoint's {saved.get(name)!r}, this job's {current.get(name)!r}"
               for name in sorted(set(saved) | set(current)) if saved.get(name) != current.get(name)]
    return "; ".join(changed) or None
