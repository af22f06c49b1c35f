"""The debug-only message timeline (GEOMX_TRACE=1): off by default, and when on, each van writes when every
message was queued, handed to its socket, received and handled, on the shared clock."""

from __future__ import annotations

import json
import queue
import time

import numpy as np

from geomx.config import LinkSpec, PartySpec, Topology, node_config_from_env
from geomx.protocol.wire import Kind, Message
from geomx.transport.trace import Tracer, read_trace
from geomx.transport.van import Van


def test_off_unless_the_environment_asks(tmp_path):
    topo = tmp_path / "t.yaml"
    topo.write_text("parties: {dc0: {workers: 1}}\n")
    env = {"GEOMX_TOPOLOGY": str(topo), "GEOMX_GLOBAL_SCHEDULER": "127.0.0.1:9100", "GEOMX_ROLE": "worker",
           "GEOMX_PARTY": "dc0", "GEOMX_SCHEDULER": "127.0.0.1:9000", "GEOMX_RUN_DIR": str(tmp_path)}
    assert node_config_from_env(env).trace is False
    assert node_config_from_env({**env, "GEOMX_TRACE": "1"}).trace is True
    assert Tracer.for_node(False, tmp_path, "dc0/worker0") is None
    assert Tracer.for_node(True, None, "dc0/worker0") is None  # no run folder: nowhere to write


def test_a_message_leaves_a_queue_out_in_handled_timeline(tmp_path):
    topo = Topology(parties=(PartySpec("a", 1), PartySpec("b", 1)), central="a", wan=LinkSpec(), lan=LinkSpec())
    got: queue.Queue[Message] = queue.Queue()
    sender = Van("a/worker/1", party="a", topology=topo, handler=lambda m: None)
    receiver = Van("b/server/1", party="b", topology=topo, handler=got.put)
    sender.tracer = Tracer.for_node(True, tmp_path / "a", "a/worker0")
    receiver.tracer = Tracer.for_node(True, tmp_path / "b", "b/server")
    try:
        receiver.start()
        sender.start()
        sender.add_peer(receiver.identity, receiver.address, "b")
        receiver.add_peer(sender.identity, sender.address, "a")
        before = time.time()
        message = Message(Kind.PUSHPULL, key=3, slice=1, num_slices=2, round=7, tensor=np.ones(1000, np.float32))
        sender.send(receiver.identity, message)
        assert got.get(timeout=10).key == 3
    finally:
        sender.stop()
        receiver.stop()
    events = [e for e in read_trace([tmp_path / "a", tmp_path / "b"]) if e["kind"] == "PUSHPULL"]
    assert [(e["node"], e["event"]) for e in events] == [
        ("a/worker0", "queue"), ("a/worker0", "out"), ("b/server", "in"), ("b/server", "handled")]
    assert all(e["key"] == 3 and e["slice"] == 1 and e["round"] == 7 for e in events)
    assert events[0]["t"] >= before and events[2]["nbytes"] >= 4000 and events[2]["peer"] == "a/worker/1"


def test_a_trace_of_an_older_geomx_names_the_slice_as_this_one_does(tmp_path):
    old = {"node": "b/server", "t": 1.0, "event": "in", "peer": "a/worker/1", "kind": "PUSHPULL", "key": 3,
           "part": 1, "round": 7, "reply": False, "nbytes": 4000}
    (tmp_path / "trace").mkdir()
    (tmp_path / "trace" / "b_server.jsonl").write_text(json.dumps(old) + "\n")
    [event] = read_trace([tmp_path])
    assert event["slice"] == 1 and "part" not in event
