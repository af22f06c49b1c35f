"""The character transformer's named shapes (issue 23): ``gpt85m`` is GPT-2 small's blocks at about 85M parameters,
an unknown name says which names exist, and the default feed-forward width (2x) leaves every earlier model as it was.
The parameter counts are computed here from the architecture, not read back from the model."""

from __future__ import annotations

import pytest

from geomx.zoo.charlm import PRESETS, VOCAB, CharTransformer, Shape, build


def expected_params(dim: int, layers: int, context: int, ff: int) -> int:
    """Token and position embeddings, ``layers`` pre-norm blocks, the final norm and the head."""
    hidden = ff * dim
    attention = 3 * dim * dim + 3 * dim + dim * dim + dim  # packed q/k/v projection and the output projection
    feed_forward = dim * hidden + hidden + hidden * dim + dim
    block = attention + feed_forward + 2 * 2 * dim  # two LayerNorms, weight and bias each
    return VOCAB * dim + context * dim + layers * block + 2 * dim + dim * VOCAB + VOCAB


def count(model: CharTransformer) -> int:
    return sum(p.numel() for p in model.parameters())


def test_gpt85m_is_gpt2_small_blocks_at_about_85m_parameters() -> None:
    shape = PRESETS["gpt85m"]
    assert (shape.dim, shape.layers, shape.heads, shape.context, shape.ff) == (768, 12, 12, 256, 4)
    params = count(build("gpt85m"))
    assert params == expected_params(768, 12, 256, 4) == 85_449_344
    assert 84_000_000 <= params <= 86_000_000


def test_gpt57m_is_the_earlier_gpu_runs_model() -> None:
    assert count(build("gpt57m")) == expected_params(768, 12, 256, 2) == 57_119_360


def test_gpt43m_is_gpt85m_at_half_its_depth_and_about_half_its_size() -> None:
    """The bench's memory scaling compares the 85M job with a model half its size."""
    assert count(build("gpt43m")) == expected_params(768, 6, 256, 4) == 42_922_112
    assert abs(2 * 42_922_112 - 85_449_344) < 0.01 * 85_449_344


def test_the_default_feed_forward_width_is_unchanged() -> None:
    """``ff`` defaults to 2: the examples' model (tiny) has the parameter count it had before presets."""
    tiny = PRESETS["tiny"]
    assert (tiny.dim, tiny.layers, tiny.heads, tiny.context, tiny.ff) == (64, 2, 4, 64, 2)
    default = CharTransformer(context=64, dim=64, layers=2, heads=4)
    assert count(default) == count(build("tiny")) == expected_params(64, 2, 64, 2) == 87_680
    assert all(block.linear1.out_features == 2 * 64 for block in default.blocks)


def test_build_takes_a_shape_and_its_feed_forward_width() -> None:
    model = build(Shape(dim=32, layers=1, heads=2, context=16, ff=3))
    assert model.blocks[0].linear1.out_features == 96
    assert count(model) == expected_params(32, 1, 16, 3)


def test_an_unknown_preset_names_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="nope") as raised:
        build("nope")
    for name in ("tiny", "gpt57m", "gpt85m", "gpt43m"):
        assert name in str(raised.value)


def test_every_preset_has_a_one_line_summary() -> None:
    for shape in PRESETS.values():
        assert shape.summary and "\n" not in shape.summary
        assert shape.dim % shape.heads == 0
