"""``geomx.torch.amp.grad_scaler_skips``: what the wrapper does when a ``torch.amp.GradScaler`` calls its step."""

from __future__ import annotations

import pytest
import torch

from geomx.torch.amp import grad_scaler_skips


def test_without_a_scaler_nothing_changes_and_nothing_is_skipped() -> None:
    grads = [torch.full((3,), 8.0)]
    assert grad_scaler_skips({}, grads, averaged=False) is False
    assert grads[0].tolist() == [8.0] * 3


def test_a_scaler_unscales_the_averaged_gradients_and_skips_on_its_found_inf() -> None:
    grads = [torch.full((3,), 8.0), torch.full((2,), -4.0)]
    call = {"grad_scale": torch.tensor(4.0), "found_inf": torch.tensor(0.0)}
    assert grad_scaler_skips(call, grads, averaged=True) is False
    assert grads[0].tolist() == [2.0] * 3 and grads[1].tolist() == [-1.0] * 2
    assert grad_scaler_skips({"found_inf": torch.tensor(1.0)}, grads, averaged=True) is True  # after unscale_
    assert grads[0].tolist() == [2.0] * 3, "scaler.unscale_(opt) unscaled them already: not again"


def test_a_scaler_before_average_gradients_is_refused_naming_the_call() -> None:
    with pytest.raises(RuntimeError, match=r"call opt.average_gradients\(\) after backward and before"):
        grad_scaler_skips({"grad_scale": torch.tensor(4.0), "found_inf": torch.tensor(0.0)}, [], averaged=False)
