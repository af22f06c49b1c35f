"""A model sharded by FSDP2 with its optimizer on the ranks and ``checkpoint.dir`` set is refused at start (its
checkpoints are not written yet), and the refusal's fix is one the job's plan has. Before, HFA and DiLoCo jobs were
told to set ``server_optimizer: translate under FSA``: under HFA the inner optimizer steps on the ranks whatever the
server optimizer, so that advice could not help (docs/collective.md, "FSDP2 inside a party")."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from geomx.algorithms.modes import Strategy
from geomx.config import ConfigError
from geomx.torch.checkpoint import worker_checkpoints


def _refusal(mode: Strategy, tmp_path: Path) -> str:
    """The error ``worker_checkpoints`` gives a sharded model's rank of party dc1 under ``mode``."""
    config = SimpleNamespace(party="dc1", topology=SimpleNamespace(checkpoint=SimpleNamespace(dir=tmp_path)))
    loop = SimpleNamespace(plan=SimpleNamespace(mode=mode), strategy=SimpleNamespace(steps_of=lambda rounds: 10))
    with pytest.raises(ConfigError) as raised:
        worker_checkpoints(loop, config, sharded=True)  # type: ignore[arg-type]
    return str(raised.value)


def test_under_fsa_the_refusal_names_the_server_optimizer(tmp_path: Path) -> None:
    text = _refusal(Strategy.LOCAL, tmp_path)
    assert text.startswith("party dc1: checkpoints of a model sharded by FSDP2"), text
    assert "set training.server_optimizer: translate" in text and "leave checkpoint.dir out" in text, text


@pytest.mark.parametrize("mode", [Strategy.HFA, Strategy.ESYNC])
def test_under_hfa_the_refusal_does_not_offer_a_server_optimizer(mode: Strategy, tmp_path: Path) -> None:
    text = _refusal(mode, tmp_path)
    assert "server_optimizer: translate" not in text and "under FSA" not in text, text
    assert text.endswith("the inner optimizer steps on the ranks whatever the server optimizer: leave checkpoint.dir "
                         "out"), text
