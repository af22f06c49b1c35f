"""``geomx.protocol.tensors``: torch tensors as the NumPy arrays the wire and the servers hold, a bfloat16 one
widened to float32 exactly, and the answers rounded back as torch rounds."""

from __future__ import annotations

import numpy as np
import torch

from geomx.protocol.tensors import host_numpy, readonly_tensor, wire_dtype
from geomx.worker.slices import to_numpy


def test_numpy_dtypes_travel_as_they_are_and_bfloat16_as_float32() -> None:
    for dtype in (torch.float32, torch.float16, torch.float64, torch.int64):
        assert wire_dtype(dtype) == dtype
    assert wire_dtype(torch.bfloat16) == torch.float32


def test_a_float32_tensor_is_a_view_and_a_bfloat16_one_an_exact_float32_copy() -> None:
    weights = torch.randn(3, 5)
    view = host_numpy(weights)
    assert view.dtype == np.float32 and view.shape == (15,) and np.shares_memory(view, weights.numpy())
    model = (torch.randn(4097) * torch.logspace(-30, 30, 4097)).bfloat16()
    wide = host_numpy(model)
    assert wide.dtype == np.float32 and not np.shares_memory(wide, model.view(torch.int16).numpy())
    assert torch.equal(torch.from_numpy(wide).bfloat16(), model)  # every bfloat16 value, exactly
    np.testing.assert_array_equal(to_numpy(model, snapshot=False), wide)
    np.testing.assert_array_equal(to_numpy(model, snapshot=True), wide)


def test_a_snapshot_is_a_copy_and_a_non_contiguous_tensor_travels_flat() -> None:
    weights = torch.arange(12.0).reshape(3, 4)
    snapshot = to_numpy(weights, snapshot=True)
    weights.zero_()
    assert snapshot.tolist() == list(range(12))
    columns = torch.arange(12.0).reshape(3, 4)[:, ::2]
    assert host_numpy(columns).tolist() == [0, 2, 4, 6, 8, 10]


def test_a_float32_answer_lands_in_a_bfloat16_model_rounded_to_nearest_even() -> None:
    answer = np.array([1 + 2**-8, 1 + 3 * 2**-8, 0.1], np.float32)  # two ties: to the even neighbour
    model = torch.zeros(3, dtype=torch.bfloat16)
    model.copy_(readonly_tensor(answer))
    assert model.float().tolist() == [1.0, 1 + 4 * 2**-8, float(torch.tensor(0.1).bfloat16())]


def test_a_bfloat16_push_goes_as_bfloat16_bits_unless_a_codec_is_set_or_the_route_carries_plain_tensors() -> None:
    from geomx.codecs import BF16, FP16
    from geomx.worker.slices import push_codec

    model, weights = torch.zeros(3, dtype=torch.bfloat16), torch.zeros(3)
    assert isinstance(push_codec(None, model), BF16) and push_codec(None, weights) is None
    configured = FP16()  # the fp16 switch's, or the job's: it wins
    assert push_codec(configured, model) is configured
    assert push_codec(None, model, route_encodes=False) is None  # TSEngine's relays sum plain float32 tensors
    from geomx.algorithms.tsengine.worker import RelayRoute
    from geomx.core.worker_plugins import PushRoute

    # a relay given a payload raises "the relay route carries a tensor" (a bfloat16 model under intra TSEngine)
    assert PushRoute.carries_codecs and not RelayRoute.carries_codecs
