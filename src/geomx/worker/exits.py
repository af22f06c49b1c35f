"""How a worker's process ends, as the kvstore arranges it for a training script (``kv.create``'s ``close_at_exit``).

At exit the worker leaves the job with a shutdown round through its servers (``KVStore.close``): a script that
never calls ``close`` (MXNet's kvstore did it for it) still ends cleanly. ``LeaveAtExit`` is that exit hook. Two
ways a process ends call for less:

* an uncaught exception (Python sets ``sys.last_value`` before the exit hooks run): the worker just disconnects, the
  process exits at once with its error, and the launcher stops the job;
* ``sys.exit(3)`` (a script quitting on NaN), or the script's end, while the others still train. Python keeps the
  exit code from the exit hooks (``SystemExit`` sets no ``sys.last_value``, and nothing else records it; wrapping
  ``sys.exit`` would patch every caller's), so the hook cannot tell it from the end of training and says goodbye as
  usual. The server can tell: with a round that can never complete without this worker, it refuses the goodbye at
  once, naming the round, and notes who left (``geomx.server.pushpull``, ``geomx.runs.findings``). The hook says so
  in one line, not an "Exception ignored in atexit callback" traceback after the shutdown timeout, and the process
  ends with its own exit code: a non-zero one stops the job at once, as a crash does (the launcher names the worker
  and its code); after a code 0 the heartbeats declare the worker dead, which stops its tier. The launcher's
  summary names it either way.

Uncaught errors that say the job failed beyond this process (``RequestTimeout``: no answer in time; ``RemoteError``:
a server refused, its text saying who and why; ``PartyError``: a collective of a ``lan: collective`` party failed, a
rank having died or hung) print one line, not a traceback through the training loop
(``quiet_failures``): the stack says where the loop waited, not why, and every healthy worker of a stalled job
prints one. Any other error keeps its traceback.

Usage (``KVStore.close_at_exit``)::

    quiet_failures()
    atexit.register(LeaveAtExit(store.close, store.name))
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import TracebackType

from ..collective.group import PartyError
from ..transport.rpc import RemoteError, RequestTimeout

FAILURES = (RequestTimeout, RemoteError, PartyError)
_QUIET = "_geomx_quiet_failures"  # marks the hook installed, so that a second kvstore does not wrap it again


def one_line(error: BaseException) -> str:
    """What the process prints for ``error`` (a ``FAILURES`` one) instead of its traceback."""
    return f"geomx: stopped: {error}"


def quiet_failures() -> None:
    """Print uncaught ``FAILURES`` as one line (``one_line``), every other exception as the hook in place did
    (Python's, or the script's own). Why ``sys.excepthook``: it is the hook Python provides for exactly this; it runs
    after ``sys.last_value`` is set, so ``LeaveAtExit`` still knows the process failed, and the exit code stays 1."""
    previous = sys.excepthook
    if getattr(previous, _QUIET, False):
        return

    def hook(kind: type[BaseException], error: BaseException, trace: TracebackType | None) -> None:
        if isinstance(error, FAILURES):
            print(one_line(error), file=sys.stderr, flush=True)
            return
        previous(kind, error, trace)

    setattr(hook, _QUIET, True)
    sys.excepthook = hook


class LeaveAtExit:
    """The exit hook: ``close(crashed)``, crashed after an uncaught exception; a goodbye that fails (refused by a
    server that still needed this worker, or unanswered) is said in one line rather than a traceback."""

    def __init__(self, close: Callable[[bool], None], name: str) -> None:
        self.close = close
        self.name = name

    def __call__(self) -> None:
        try:
            self.close(hasattr(sys, "last_value"))  # (set by Python after an uncaught exception)
        except Exception as exc:  # an exit hook's traceback says no more than the line
            print(f"geomx: {self.name} left the job without a clean shutdown: {exc}", file=sys.stderr, flush=True)
