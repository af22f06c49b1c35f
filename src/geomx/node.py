"""Entry point of the non-worker roles: ``python -m geomx.node`` runs whatever GEOMX_ROLE says.

Workers are the user's own script (they call ``geomx.kv.create``); schedulers and servers are this.

Usage::

    GEOMX_ROLE=global_scheduler GEOMX_GLOBAL_SCHEDULER=127.0.0.1:9000 ... python -m geomx.node
"""

from __future__ import annotations

import gc
import logging
import signal
import sys

from .config import ConfigError, NodeConfig, Role, node_config


def run_node(config: NodeConfig) -> int:
    """Run one scheduler or server until the job ends; returns the exit code."""
    if config.role in (Role.GLOBAL_SCHEDULER, Role.LOCAL_SCHEDULER):
        from .cluster.scheduler import Scheduler
        from .runs.runlog import StatsFile

        gc.freeze()  # the modules live as long as the process: no collection needs to scan them again
        scheduler = Scheduler(config)
        # its counters too (registration, heartbeats, barriers cross the WAN): every byte of the job has a sender
        # the global scheduler's: the parties' model digests compared, as the status page last showed them
        models = (lambda: {"models": scheduler.board.model_digests()}) if config.role is Role.GLOBAL_SCHEDULER \
            else dict
        with StatsFile(config.run_dir, scheduler.name, lambda: {"role": config.role.value, "party": config.party,
                                                                **scheduler.van.counters.snapshot(), **models()}):
            return scheduler.run()
    if config.role in (Role.GLOBAL_SERVER, Role.LOCAL_SERVER):
        from .server import ParameterServer
        from .server.heap import keep_freed_memory

        keep_freed_memory()  # before its threads start: each round's large arrays reuse the last round's memory
        gc.freeze()
        return ParameterServer(config).run()
    raise ConfigError("workers run your training script (which calls geomx.kv.create), not geomx.node")


def configure_logging(level: int = logging.INFO) -> None:
    logging.basicConfig(level=level, format="%(levelname)s %(message)s", stream=sys.stderr)


def _terminate(_signum: int, _frame: object) -> None:
    """SIGTERM ends a scheduler or server as Ctrl-C does: its ``finally`` blocks run, so its counters are written
    (``runs.runlog.StatsFile``) before it exits; a second SIGTERM ends it at once."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    raise KeyboardInterrupt


def main() -> int:
    configure_logging()
    signal.signal(signal.SIGTERM, _terminate)
    try:  # from here on: a SIGTERM (the launcher ending a job that failed at start) while anything still imports
        return _configured_node()
    except KeyboardInterrupt:
        return 130


def _configured_node() -> int:
    try:
        config = node_config()
    except ConfigError as exc:
        logging.error("configuration error: %s", exc)
        return 2
    from .cluster.membership import JoinRefused
    from .transport.reach import BindError
    from .transport.security import SecurityError

    try:
        return run_node(config)
    except SecurityError as exc:  # a CURVE key file its van cannot read: one line naming it and its party
        logging.error("configuration error: %s", exc)
        return 2
    except (TimeoutError, JoinRefused, BindError) as exc:  # a bad start: one line naming it, no traceback
        logging.error("%s", exc)
        return 3


if __name__ == "__main__":
    sys.exit(main())
