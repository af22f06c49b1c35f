"""Whether an error in a van's I/O thread only says that ZeroMQ is going away under a van being shut down.

Why: Ctrl-C of a job ends a worker's interpreter while its van still sends (the kvstore's exit hook flushes what
is queued): pyzmq stops its zero-copy garbage collector at exit (``RuntimeError: zmq gc socket requested during
shutdown``), a terminated context fails every socket call (ETERM), a closed socket every call on it. The I/O
thread has nothing more to move then, and "Exception in thread dc1/worker-io" with a traceback is noise on the
user's screen. The same errors while the van runs are faults, and still surface.

Usage (the van's I/O thread)::

    except Exception as exc:
        if not ended_by_shutdown(exc, stopping=self._stopping.is_set()):
            raise
"""

from __future__ import annotations

import threading

import zmq


def interpreter_exiting() -> bool:
    """The main thread has finished: the interpreter is exiting (``threading`` marks its main thread stopped before
    the ``atexit`` handlers run, pyzmq's among them), while daemon threads, a van's, still run."""
    return not threading.main_thread().is_alive()


def ended_by_shutdown(exc: BaseException, stopping: bool) -> bool:
    """True where ``exc`` is ZeroMQ going away: its context terminated (only a shutdown does that: the van's
    ``stop``, pyzmq's at exit), or, while the van stops (``stopping``) or the interpreter exits, any ZeroMQ error
    (a closed socket) or pyzmq's refusal of a zero-copy frame after its exit handler ran."""
    if isinstance(exc, zmq.ZMQError) and exc.errno == zmq.ETERM:
        return True
    if not (stopping or interpreter_exiting()):
        return False
    return isinstance(exc, zmq.ZMQError) or (isinstance(exc, RuntimeError) and "zmq" in str(exc))
