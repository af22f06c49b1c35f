"""``opt.join()`` refused with the script's DDP or an FSDP2 model says that it is refused, and names which of the two
(docs/collective.md, "Uneven loops": "refused, naming them"). Before, both read "join() evens out the loops of a
collective party whose model is neither the script's DDP nor sharded by FSDP2", a description that named neither
the refusal nor the model's kind. And a party's collective that fails (as one does at the round timeout when a
rank's loop ended early without ``join()``) names that cause and ``join()``: before, it named death, a hang or a
model mismatch only."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from geomx.torch import join
from geomx.torch.join import UnevenLoops


def _wrapper(*, ddp: bool) -> SimpleNamespace:
    """What ``UnevenLoops.of`` reads of a collective rank's wrapper (a party group it never reaches here)."""
    return SimpleNamespace(ranks=SimpleNamespace(group=None), ddp=object() if ddp else None,
                           params=[torch.nn.Parameter(torch.zeros(2))], kv=SimpleNamespace(name="dc1/worker0"))


def test_the_scripts_ddp_is_named_in_a_refusal() -> None:
    with pytest.raises(RuntimeError) as raised:
        UnevenLoops.of(_wrapper(ddp=True))
    text = str(raised.value)
    assert text.startswith("dc1/worker0: join() is refused with the script's DistributedDataParallel: "), text
    assert "FSDP2" not in text, text


def test_an_fsdp2_model_is_named_in_a_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(join, "is_sharded", lambda _tensor: True)  # a DTensor needs a process group
    with pytest.raises(RuntimeError) as raised:
        UnevenLoops.of(_wrapper(ddp=False))
    text = str(raised.value)
    assert text.startswith("dc1/worker0: join() is refused with an FSDP2-sharded model (fully_shard): "), text
    assert "DistributedDataParallel" not in text and "the same number of steps" in text, text


def test_a_plain_model_is_not_refused() -> None:
    assert join.join_refusal(ddp=False, sharded=False) is None


def test_a_failed_collective_names_uneven_loops_and_join() -> None:
    """A rank whose loop ended early without ``join()`` makes its party's next collective fail at the round timeout
    (docs/collective.md, "Uneven loops"): the error names that cause and its fix among the others."""
    from geomx.collective.group import PartyError, PartyGroup

    def timed_out() -> None:
        raise RuntimeError("Timed out waiting 15000ms for recv operation to complete")

    with pytest.raises(PartyError) as raised:
        PartyGroup("dc1", 1, 2)._run("barrier", timed_out)
    text = str(raised.value)
    assert text.startswith("party dc1: rank 1's barrier failed (a rank of the party died, hung past the round "
                           "timeout, ended its loop at another step than the others (`with opt.join():` evens that "
                           "out), or disagrees on the model): Timed out waiting"), text
