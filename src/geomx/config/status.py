"""The global scheduler's status page settings (the topology's ``status`` block; ``geomx.cluster.status_page``).

Usage::

    StatusSpec(host="0.0.0.0", port=9100)      # `status: {host: 0.0.0.0, port: 9100}`
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ConfigError
from .fields import setting
from .kinds import BOOL, INT, STR


@dataclass(frozen=True)
class StatusSpec:
    """The global scheduler's live status page: ``/`` (HTML), ``/status.json`` and Prometheus ``/metrics``.

    On by default, bound to ``host`` (127.0.0.1: this machine only) at ``port`` (0: a free one, which
    ``geomx launch`` prints as ``status : http://HOST:PORT/``); ``status: false`` in the topology turns it off.
    The page shows no secret. Usage: ``StatusSpec(host="0.0.0.0", port=9100)``.
    """

    enabled: bool = setting(True, kind=BOOL, env="GEOMX_STATUS",
                            doc="serve the status page and metrics from the global scheduler (`status: false`: off)")
    host: str = setting("127.0.0.1", kind=STR, env="GEOMX_STATUS_HOST",
                        doc="address the status page binds (0.0.0.0: every interface; mind who can reach it)")
    port: int = setting(0, kind=INT, env="GEOMX_STATUS_PORT",
                        doc="port of the status page (0: a free one, printed by `geomx launch`)")

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"status.port must be 0..65535 (0: a free one), got {self.port}")
        if not self.host.strip():
            raise ConfigError("status.host must be an address, got an empty string")
