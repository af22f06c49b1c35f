"""The codec slot: which codec a server encodes a value with before it travels.

Two sources fill it: the job's codec for wide floats, chosen once at start by the composition root from the
typed config (it serves the LAN and the WAN alike), and the WAN codec the master sets later (CONFIGURE), which
takes the WAN over. The core asks the slot and names no codec.

Usage::

    slot = Encoding(wide=some_codec)
    slot.wan_for(value)      # the master's WAN codec, else ``some_codec`` if ``value`` is float32/float64
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..codecs import Codec


class Encoding:
    """The codecs a server encodes with (see the module docstring)."""

    def __init__(self, wide: Codec | None = None) -> None:
        self.wide = wide  # for float32 / float64 values on every link (None: dense)
        self.wan: Codec | None = None  # the master's WAN compression
        self.wan_spec: dict[str, Any] | None = None  # as the master sent it: given to rejoining parties

    @property
    def plain(self) -> bool:
        """Whether values travel as they are on every link (no codec set)."""
        return self.wide is None and self.wan is None

    def lan_for(self, value: np.ndarray) -> Codec | None:
        """The codec for ``value`` on the LAN: the wide-float codec if ``value`` is wider than it keeps."""
        if self.wide is None or value.dtype not in (np.float32, np.float64):
            return None
        return self.wide

    def wan_for(self, value: np.ndarray) -> Codec | None:
        """The codec for ``value`` on the WAN: the master's, else the LAN's."""
        return self.wan or self.lan_for(value)

    def set_wan(self, codec: Codec, spec: dict[str, Any]) -> None:
        self.wan, self.wan_spec = codec, spec
