"""Scheduler ports held by the launcher: nobody else can pick one, the scheduler itself can bind it."""

from __future__ import annotations

import socket

import pytest
import zmq

from geomx.cluster import ports as ports_module
from geomx.launch import PortReservations, free_port


def plain_bind(port: int) -> None:
    """What any other picker does first (free_port, a test, another job's launcher): a bind without reuse."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", port))


def test_a_held_port_is_refused_to_other_pickers_and_bound_by_the_scheduler():
    context = zmq.Context()
    try:
        with PortReservations("127.0.0.1") as ports:
            port = ports.take()
            assert 0 < port < 65536
            with pytest.raises(OSError):
                plain_bind(port)
            with PortReservations("127.0.0.1") as others, pytest.raises(OSError):
                others._hold(port)  # a second launcher picking the same port is refused it
            router = context.socket(zmq.ROUTER)
            router.bind(f"tcp://127.0.0.1:{port}")  # the scheduler (ZeroMQ sets SO_REUSEADDR) binds it
            dealer = context.socket(zmq.DEALER)
            dealer.connect(f"tcp://127.0.0.1:{port}")
            dealer.send(b"register")
            assert router.poll(10_000), "nothing reached the scheduler's socket on the held port"
            assert router.recv_multipart()[1] == b"register"
            dealer.close(linger=0)
            router.close(linger=0)
    finally:
        context.term()


def test_two_takes_give_two_ports_released_at_the_end_and_free_port_releases_its_port_at_once():
    with PortReservations("127.0.0.1") as ports:
        first, second = ports.take(), ports.take()
        assert first != second
    plain_bind(first)
    plain_bind(second)
    plain_bind(free_port())


def test_a_plan_without_held_ports_never_gives_two_schedulers_the_same_port(monkeypatch, tmp_path):
    """Released at once, a picked port can come up again for the next scheduler of the same plan: the picker
    remembers what it gave (here the OS's picks repeat on purpose)."""
    from geomx import launch as launch_module
    from geomx.config import topology_from_dict
    from geomx.launch import plan_processes

    repeats = iter([20001, 20001, 20001, 20002, 20002, 20003, 20004, 20005, 20006])
    for module in (ports_module, launch_module):
        monkeypatch.setattr(module, "free_port", lambda host="127.0.0.1": next(repeats))
    topology = topology_from_dict({"parties": {"dc0": 1, "dc1": 1}})
    specs = plan_processes(topology, tmp_path / "t.yaml", ["python", "train.py"], tmp_path)
    addresses = {value for spec in specs for key, value in spec.env.items() if key.endswith("SCHEDULER")}
    assert len(addresses) == 3, [spec.env for spec in specs]
