"""Which codecs take a size bound is the codec's to say (``Codec.size_bound``), read through the registry.

The kvstore (``set_gradient_compression``) and a collective party's ranks (``use_compression``) fill in the
topology's ``size_lower_bound`` through one function, ``codecs.worker_codec``; a codec registered here with the
attribute is size-bound in both without any list being edited.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

from geomx.codecs import BSC, FP16, MPQ, CodecError, Dense, Registry, SizeAdaptive, default_registry, worker_codec
from geomx.kv import KVStore
from geomx.worker.ranks import PartyRanks
from geomx.worker.sender import SliceSender


class Gated(Dense):
    """A test codec that declares a size bound: dense on the wire, remembering the bound it was built with."""

    name: ClassVar[str] = "gated_for_test"
    codec_id: ClassVar[int] = 61
    size_bound: ClassVar[bool] = True

    def __init__(self, size_lower_bound: int = 7) -> None:
        self.bound = size_lower_bound


class Ungated(Dense):
    """The same without the attribute: a spec that names no bound is left alone."""

    name: ClassVar[str] = "ungated_for_test"
    codec_id: ClassVar[int] = 62

    def __init__(self, size_lower_bound: int = 7) -> None:
        self.bound = size_lower_bound


def registry() -> Registry:
    codecs = default_registry()
    codecs.register(Gated)
    codecs.register(Ungated)
    return codecs


def test_the_built_in_size_bound_codecs_are_bsc_and_mpq() -> None:
    codecs = default_registry()
    assert [name for name in codecs.names() if codecs.wants_size_bound(name)] == ["bsc", "mpq"]
    assert BSC.size_bound and MPQ.size_bound and not FP16.size_bound and not SizeAdaptive.size_bound
    assert not codecs.wants_size_bound("no_such_codec") and not codecs.wants_size_bound(None)


def test_a_codec_declaring_size_bound_gets_the_topologys_bound() -> None:
    codecs = registry()
    asked = {"type": "gated_for_test"}
    spec, codec = worker_codec(codecs, asked, 123)
    assert spec == {"type": "gated_for_test", "size_lower_bound": 123} and isinstance(codec, Gated)
    assert codec.bound == 123 and asked == {"type": "gated_for_test"}  # the caller's spec is not changed
    spec, codec = worker_codec(codecs, {"type": "ungated_for_test"}, 123)
    assert spec == {"type": "ungated_for_test"} and isinstance(codec, Ungated) and codec.bound == 7
    spec, codec = worker_codec(codecs, {"type": "gated_for_test", "size_lower_bound": 5}, 123)  # the spec's wins
    assert spec["size_lower_bound"] == 5 and isinstance(codec, Gated) and codec.bound == 5


@pytest.mark.parametrize(("asked", "bound"), [({"type": "bsc", "threshold": 0.1}, 321),
                                              ({"type": "mpq", "threshold": 0.1}, 321),
                                              ({"type": "bsc", "size_lower_bound": 9}, 9)])
def test_bsc_and_mpq_are_gated_by_the_bound(asked: dict[str, Any], bound: int) -> None:
    spec, codec = worker_codec(default_registry(), asked, 321)
    assert spec["size_lower_bound"] == bound
    assert isinstance(codec, SizeAdaptive) and codec.bound == bound


def test_a_bad_spec_raises_the_codecs_own_error() -> None:
    with pytest.raises(CodecError, match="unknown codec 'nope'"):
        worker_codec(default_registry(), {"type": "nope"}, 10)
    with pytest.raises(CodecError, match="a codec spec is"):
        worker_codec(default_registry(), {"type": 3}, 10)


def test_collective_ranks_read_the_bound_from_the_codec() -> None:
    sender = SliceSender(None, None, None, registry(), timeout_s=1.0)  # type: ignore[arg-type]
    ranks = PartyRanks(SimpleNamespace(world_size=2), True, sender, size_lower_bound=44)  # type: ignore[arg-type]
    ranks.use_compression({"type": "gated_for_test"})
    assert isinstance(ranks.codec, Gated) and ranks.codec.bound == 44
    ranks.use_compression({"type": "ungated_for_test"})
    assert isinstance(ranks.codec, Ungated) and ranks.codec.bound == 7


def test_the_kvstore_sends_the_bound_the_codec_wants() -> None:
    sent: list[Any] = []
    kv = SimpleNamespace(is_master_worker=True, _codecs=registry(), _topology=SimpleNamespace(size_lower_bound=55),
                         _configure=lambda body, what: sent.append(body.compression))
    KVStore.set_gradient_compression(kv, {"type": "gated_for_test"})  # type: ignore[arg-type]
    KVStore.set_gradient_compression(kv, {"type": "ungated_for_test"})  # type: ignore[arg-type]
    KVStore.set_gradient_compression(kv, {"type": "fp16"})  # type: ignore[arg-type]
    assert sent == [{"type": "gated_for_test", "size_lower_bound": 55}, {"type": "ungated_for_test"},
                    {"type": "fp16"}]
    with pytest.raises(CodecError, match="unknown codec"):
        KVStore.set_gradient_compression(kv, {"type": "nope"})  # type: ignore[arg-type]
    assert len(sent) == 3
