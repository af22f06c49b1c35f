"""The one error type of the config layer: a topology file or environment that cannot describe a valid job.

Usage::

    raise ConfigError("topology has no parties")
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A topology file or environment that cannot describe a valid geomx job."""

