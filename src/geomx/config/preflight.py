"""What ``geomx launch`` checks before it starts any process: its own options against the job's topology, the
worker command, and every process's configuration, built from the environment that process will get exactly as
the process will build it.

Why here and not in the processes: a value every process would refuse at its start (``GEOMX_HFA_K1=abc``, a
``--resume`` with no checkpoint folder) otherwise starts the whole job, prints the same error once per process and
fails it; refused here it is one ``geomx launch: ...`` line and exit code 2, with nothing started
(docs/deployment.md, "Bad starts"). The processes still check what they are given: a process started by hand
(torchrun's ranks, a by-hand launch) has no launcher before it. The CURVE key files every process needs are
checked by ``geomx.transport.security.check_keys``, which the launcher calls after these (config sits below
transport and does not read key files; the one place they are read is there).

Usage::

    check_start(topology, command, os.environ, party=None, resume=False, global_scheduler=None, global_only=False)
    check_processes({**os.environ, **spec.env} for spec in specs)
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Mapping, Sequence

from .env import check_address, node_config_from_env
from .errors import ConfigError
from .topology import Topology


def check_start(topology: Topology, command: Sequence[str], env: Mapping[str, str], *, party: str | None,
                resume: bool, global_scheduler: str | None, global_only: bool) -> None:
    """ConfigError naming the first of ``geomx launch``'s options that cannot start the job ``topology`` (as the
    environment ``env`` leaves it: ``config.job_topology``); the worker command is checked where workers start."""
    if global_only and party is not None:
        raise ConfigError("--global-only starts the global tier alone: leave out --party")
    if global_scheduler is not None:
        check_address(global_scheduler, f"--global-scheduler {global_scheduler!r}")
        if int(global_scheduler.rsplit(":", 1)[1]) == 0:  # (a port no other process is told)
            raise ConfigError(f"--global-scheduler {global_scheduler!r}: port 0 picks a port at random, which the "
                              "other processes cannot be told: give a free port, or leave the option out on one host")
    elif party is not None and party != topology.central:
        raise ConfigError(f"party {party!r} is not the central party: give --global-scheduler HOST:PORT")
    if party is not None:
        topology.party(party)  # an unknown party, named with the topology's
    if resume and topology.checkpoint.dir is None:  # (each global server would refuse it once started)
        raise ConfigError("--resume needs a checkpoint folder to resume from: set checkpoint.dir in the topology "
                          "(or GEOMX_CHECKPOINT_DIR)")
    if command and not global_only:
        check_command(command, env)


def check_command(command: Sequence[str], env: Mapping[str, str]) -> None:
    """ConfigError unless the worker command's program can be run: a path to an executable file, or a name found on
    ``env``'s PATH (where the workers, started with that environment, look for it)."""
    program = command[0]
    if shutil.which(program, path=env.get("PATH", os.defpath)) is not None:
        return
    if os.sep not in program:
        why = "no program of that name on PATH"
    elif not os.path.exists(program):
        why = "no such file"
    else:
        why = "not an executable file (chmod +x it, or start it with its interpreter: -- python script.py)"
    raise ConfigError(f"the worker command {program!r} cannot be run: {why}")


def check_processes(envs: Iterable[Mapping[str, str]]) -> None:
    """Build the NodeConfig of every process from the environment it will be started with (``node_config_from_env``,
    as each process does first): a ConfigError any of them would raise at its start is raised here, once."""
    for env in envs:
        node_config_from_env(env)
