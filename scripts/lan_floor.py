"""The floor under a collective party's FSA step: one round trip per step to the global server, another process.

Two measurements on this host, each between two Python processes over loopback TCP, 0.5 MB up (a rank's bundle of
its owned slices of the MLP) and a bare answer back (a party alone in its job gets no tensor):

- ``zmq``: bare pyzmq, a DEALER's blocking send and receive against a ROUTER that answers at once: no geomx, no
  thread of its own; what any design that sends the party's sums to another process pays per step.
- ``van``: two geomx vans, the answer made on the server's dispatch thread and sent through its I/O thread, the
  request waited on as a rank waits for its bundle (``Requests.call``, a future, resolved on the requester's
  dispatch thread).

Prints the median and 90th percentile of each, in microseconds (the first tenth dropped as warm-up). Compare the
medians with 5% of DDP's step (the lan bench's ``ddp`` row): that is the whole budget of the 1.05x goal.

Usage::

    PYTHONPATH=src python scripts/lan_floor.py --trips 3000
    PYTHONPATH=src python scripts/lan_floor.py --only van
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time
from collections.abc import Callable

import numpy as np
import zmq

from geomx.config import PartySpec, Topology
from geomx.protocol.wire import Kind, Message
from geomx.transport.rpc import Requests
from geomx.transport.van import Van

PAYLOAD = 1 << 19  # bytes up per trip: about one rank's share of the 0.3M-parameter MLP's gradients
TOPOLOGY = Topology(parties=(PartySpec("a", 2),), central="a")


def _zmq_server(port: int, trips: int) -> None:
    """Answer ``trips`` requests at once, two bytes each."""
    router = zmq.Context().socket(zmq.ROUTER)
    router.bind(f"tcp://127.0.0.1:{port}")
    for _ in range(trips):
        identity, _data = router.recv_multipart(copy=False)
        router.send_multipart([identity, b"ok"])


def zmq_trips(trips: int) -> list[float]:
    """Bare pyzmq round trips (seconds each)."""
    dealer = zmq.Context().socket(zmq.DEALER)
    port = dealer.bind_to_random_port("tcp://127.0.0.1")  # a free port, handed to the server
    dealer.unbind(dealer.LAST_ENDPOINT)
    server = mp.Process(target=_zmq_server, args=(port, trips))
    server.start()
    dealer.connect(f"tcp://127.0.0.1:{port}")
    payload = bytearray(PAYLOAD)
    return _timed(trips, lambda: (dealer.send(payload, copy=False), dealer.recv()), server.join)


def _van_server(addresses: mp.Queue, seconds: float) -> None:
    """A van answering every request from its dispatch thread with a bare reply, for ``seconds``."""
    van: Van | None = None

    def answer(message: Message) -> None:
        assert van is not None
        van.send(message.sender.decode(), message.reply())

    van = Van("server", party="a", topology=TOPOLOGY, handler=answer)
    addresses.put(van.start())
    van.add_peer("requester", _address(addresses), party="a")
    time.sleep(seconds)
    van.stop()


def _address(addresses: mp.Queue) -> str:
    """The other process's van address (or ours, for it)."""
    return str(addresses.get(timeout=60))


def van_trips(trips: int) -> list[float]:
    """Round trips through two vans (seconds each)."""
    addresses: mp.Queue = mp.Queue()
    server = mp.Process(target=_van_server, args=(addresses, 600.0), daemon=True)
    server.start()
    server_address = _address(addresses)
    requests: Requests | None = None
    van = Van("requester", party="a", topology=TOPOLOGY, handler=lambda message: requests.resolve(message)
              if requests is not None else None)
    address = van.start()
    requests = Requests(van)
    addresses.put(address)
    van.add_peer("server", server_address, party="a")
    time.sleep(0.5)
    data = np.zeros(PAYLOAD // 4, dtype=np.float32)
    calls = requests

    def trip() -> None:
        calls.call("server", Message(Kind.PUSHPULL, key=1, tensor=data)).result(timeout=60)

    def stop() -> None:
        van.stop()
        server.terminate()

    return _timed(trips, trip, stop)


def _timed(trips: int, trip: Callable[[], object], done: Callable[[], None]) -> list[float]:
    times = []
    for _ in range(trips):
        started = time.perf_counter()
        trip()
        times.append(time.perf_counter() - started)
    done()
    return times[trips // 10:]


def _say(what: str, times: list[float]) -> None:
    ordered = sorted(times)
    print(f"{what}: median {statistics.median(ordered) * 1e6:.0f} us, p90 {ordered[int(len(ordered) * 0.9)] * 1e6:.0f}"
          f" us ({len(ordered)} trips)", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trips", type=int, default=2000)
    parser.add_argument("--only", choices=["zmq", "van"])
    args = parser.parse_args(argv)
    if args.only in (None, "zmq"):
        _say("bare pyzmq round trip", zmq_trips(args.trips))
    if args.only in (None, "van"):
        _say("van round trip", van_trips(args.trips))


if __name__ == "__main__":
    main()
