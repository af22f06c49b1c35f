"""A nested codec parameter takes a codec's name alone, so int8 with error feedback can be written on one line.

Why: ``GEOMX_COMPRESSION=error_feedback:inner=int8`` (the only way to name that codec in the variable's
``name:key=value`` form) was refused with "must be a nested spec of a Codec codec".
"""

from __future__ import annotations

import pytest

from geomx.codecs import CodecError, make_codec
from geomx.codecs.error_feedback import ErrorFeedback
from geomx.codecs.int8 import Int8
from geomx.config.kinds import CODEC


def test_a_codec_name_stands_for_its_spec_without_parameters() -> None:
    by_name, by_spec = make_codec({"type": "error_feedback", "inner": "int8"}), make_codec(
        {"type": "error_feedback", "inner": {"type": "int8"}})
    assert isinstance(by_name, ErrorFeedback) and isinstance(by_name.inner, Int8)
    assert type(by_name.inner) is type(by_spec.inner)


def test_the_variable_form_builds_it_and_a_bad_one_says_what_fits() -> None:
    spec = CODEC.from_text("error_feedback:inner=int8", "GEOMX_COMPRESSION")
    assert isinstance(make_codec(spec), ErrorFeedback)
    with pytest.raises(CodecError, match=r"must be a codec: its name \('int8'\) or a nested spec"):
        make_codec({"type": "error_feedback", "inner": 3})
    with pytest.raises(CodecError, match="unknown codec 'int9'"):
        make_codec({"type": "error_feedback", "inner": "int9"})
