"""Under FSA a comm hook the script set on its own DDP is refused at start, naming it (docs/collective.md, "The
script's own DDP"): the hook's name, as DDP's logging records it. Before, the refusal quoted only torch's own
error ("register_comm_hook or register_builtin_comm_hook can only be called once."), which names no hook."""

from __future__ import annotations

from typing import Any

import pytest

from geomx.collective.ddp import keep_local
from geomx.config import ConfigError


class HookedDDP:
    """What ``keep_local`` meets of a DistributedDataParallel whose script registered ``allreduce_hook``: torch's
    refusal of a second hook, and its logging data (no process group needed)."""

    def __init__(self, logged: dict[str, Any] | None) -> None:
        self.logged = logged

    def register_comm_hook(self, _state: object, _hook: object) -> None:
        raise RuntimeError("register_comm_hook or register_builtin_comm_hook can only be called once.")

    def _get_ddp_logging_data(self) -> dict[str, Any]:
        if self.logged is None:
            raise AttributeError("_get_ddp_logging_data")
        return self.logged


def test_the_scripts_comm_hook_is_named() -> None:
    with pytest.raises(ConfigError) as raised:
        keep_local(HookedDDP({"comm_hook": "allreduce_hook"}), "dc1")  # type: ignore[arg-type]
    text = str(raised.value)
    assert text.startswith("party dc1: the model's DistributedDataParallel has a comm hook already "
                           "(allreduce_hook);"), text


def test_without_ddps_logging_torchs_error_says_it() -> None:
    with pytest.raises(ConfigError) as raised:
        keep_local(HookedDDP(None), "dc1")  # type: ignore[arg-type]
    assert "(register_comm_hook or register_builtin_comm_hook can only be called once.)" in str(raised.value)
