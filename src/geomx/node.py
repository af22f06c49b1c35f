"""Entry point of the non-worker roles: ``python -m geomx.node`` runs whatever GEOMX_ROLE says.

Workers are the user's own script (they call ``geomx.kv.create``); schedulers and servers are this.

Usage::

    GEOMX_ROLE=global_scheduler GEOMX_GLOBAL_SCHEDULER=127.0.0.1:9000 ... python -m geomx.node
"""

from __future__ import annotations

import gc
import logging
import sys

from .config import ConfigError, NodeConfig, Role, node_config


def run_node(config: NodeConfig) -> int:
    """Run one scheduler or server until the job ends; returns the exit code."""
    if config.role in (Role.GLOBAL_SCHEDULER, Role.LOCAL_SCHEDULER):
        from .cluster.scheduler import Scheduler

        gc.freeze()  # the modules live as long as the process: no collection needs to scan them again
        return Scheduler(config).run()
    if config.role in (Role.GLOBAL_SERVER, Role.LOCAL_SERVER):
        from .server import ParameterServer

        gc.freeze()
        return ParameterServer(config).run()
    raise ConfigError("workers run your training script (which calls geomx.kv.create), not geomx.node")


def configure_logging(level: int = logging.INFO) -> None:
    logging.basicConfig(level=level, format="%(levelname)s %(message)s", stream=sys.stderr)


def main() -> int:
    configure_logging()
    try:
        config = node_config()
    except ConfigError as exc:
        logging.error("configuration error: %s", exc)
        return 2
    try:
        return run_node(config)
    except TimeoutError as exc:
        logging.error("%s", exc)
        return 3
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
