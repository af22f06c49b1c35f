"""Typed configuration: the only package that reads environment variables and topology files.

Everything else in geomx receives the frozen objects built here. GeoMX's documented variable names
(``DMLC_ROLE``, ``DMLC_PS_ROOT_URI`` ...) are accepted as aliases of our ``GEOMX_*`` names; when both are
set, the ``GEOMX_*`` name wins. One module per job: ``specs`` (the typed specs), ``topology`` (the job and
one process's view of it), ``units`` (bandwidths, durations), ``yaml_io`` (topology files), ``env`` (the
environment), ``fields`` (each field declared once: YAML key, variable, alias, kind), ``kinds`` (how one value is
read and written), ``errors`` (``ConfigError``), ``combinations`` (the one table of features that do not combine),
``settings`` (the training settings a checkpoint records), ``status`` (the status page's settings),
``reference`` (the configuration reference, generated from the fields), ``preflight`` (what ``geomx launch``
checks before it starts any process).

Usage::

    topology = load_topology("topologies/demo.yaml")
    node = node_config_from_env(os.environ)      # inside a process started by `geomx launch`
"""

from __future__ import annotations

from .env import ENV_ALIASES, job_status, job_topology, job_training, node_config, node_config_from_env, node_env
from .errors import ConfigError
from .fields import named
from .settings import plan_settings, settings_difference
from .specs import (
    OUTAGE_ORIGINS,
    CheckpointSpec,
    DGTSpec,
    HFASpec,
    LanTier,
    LinkSpec,
    Mode,
    Outage,
    PartySpec,
    Role,
    SecuritySpec,
    Timeouts,
    TorchRun,
    TrainingSpec,
    TSEngineSpec,
)
from .status import StatusSpec
from .topology import AUTO_SLICE_ELEMS, LAN_SLICE_ELEMS, WAN_SLICE_ELEMS, NodeConfig, Topology, default_slice_elems
from .units import parse_bandwidth, parse_duration
from .yaml_io import load_topology, topology_from_dict, topology_to_dict

__all__ = [
    "AUTO_SLICE_ELEMS",
    "ENV_ALIASES",
    "LAN_SLICE_ELEMS",
    "OUTAGE_ORIGINS",
    "WAN_SLICE_ELEMS",
    "CheckpointSpec",
    "ConfigError",
    "DGTSpec",
    "HFASpec",
    "LanTier",
    "LinkSpec",
    "Mode",
    "NodeConfig",
    "Outage",
    "PartySpec",
    "Role",
    "SecuritySpec",
    "StatusSpec",
    "TSEngineSpec",
    "Timeouts",
    "Topology",
    "TorchRun",
    "TrainingSpec",
    "default_slice_elems",
    "job_status",
    "job_topology",
    "job_training",
    "load_topology",
    "named",
    "node_config",
    "node_config_from_env",
    "node_env",
    "parse_bandwidth",
    "parse_duration",
    "plan_settings",
    "settings_difference",
    "topology_from_dict",
    "topology_to_dict",
]
