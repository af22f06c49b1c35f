"""The codec slot: the wide-float codec the root fills serves both links until the master sets a WAN codec."""

from __future__ import annotations

import numpy as np

from geomx.codecs import FP16, default_registry
from geomx.core.encoding import Encoding


def test_the_wide_float_codec_serves_both_links_until_the_master_sets_the_wan_one() -> None:
    wide = FP16()
    slot = Encoding(wide=wide)
    floats, halves = np.zeros(3, np.float32), np.zeros(3, np.float16)
    assert slot.lan_for(floats) is wide and slot.wan_for(floats) is wide
    assert slot.lan_for(halves) is None and slot.wan_for(halves) is None  # already narrow: sent as it is
    wan = default_registry().make_codec({"type": "int8"})
    slot.set_wan(wan, {"type": "int8"})
    assert slot.wan_for(halves) is wan and slot.wan_for(floats) is wan and slot.lan_for(floats) is wide
    assert slot.wan_spec == {"type": "int8"}
    assert Encoding().wan_for(floats) is None and Encoding().lan_for(floats) is None
