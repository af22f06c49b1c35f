"""The metrics records as TensorBoard scalars: written with tensorboardX, read back from the event files."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest
from tensorboardX.proto import event_pb2

from geomx.config import ConfigError, node_config_from_env, topology_from_dict
from geomx.torch.metrics import StepRecorder, TensorBoardSink


class Store:
    """A stand-in kvstore: fixed byte counters, records kept in a list."""

    is_master_worker = False

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def counters(self) -> dict[str, Any]:
        return {"lan": {"sent": 10, "recv": 5}, "wan": {"sent": 3, "recv": 4}}

    def wan_bytes(self) -> int:
        return 7

    def record(self, **metrics: Any) -> None:
        self.records.append(metrics)

    @property
    def pulse(self) -> Store:  # noted steps are not looked at here
        return self

    def note(self, *, step: int | None = None, busy: float | None = None) -> None:
        pass


def read_scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)] from every TFRecord event file in ``folder`` (length, crc, event, crc)."""
    scalars: dict[str, list[tuple[int, float]]] = {}
    files = sorted(folder.glob("events.out.tfevents.*"))
    assert files, f"no event file in {folder}"
    for path in files:
        data, offset = path.read_bytes(), 0
        while offset < len(data):
            (length,) = struct.unpack_from("<Q", data, offset)
            event = event_pb2.Event.FromString(data[offset + 12:offset + 12 + length])
            offset += 12 + length + 4
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars


def test_every_numeric_field_of_every_record_becomes_a_scalar_at_its_step(tmp_path: Path) -> None:
    store = Store()
    recorder = StepRecorder(store, every=2, sink=TensorBoardSink(tmp_path / "tb"))
    for step in range(4):
        recorder.log(loss=float(step))
        recorder.step()
    recorder.log(accuracy=0.75)
    recorder.close()
    scalars = read_scalars(tmp_path / "tb")
    assert scalars["loss"] == [(2, 0.5), (4, 2.5)]
    assert scalars["accuracy"] == [(4, 0.75)]
    assert scalars["lan_bytes"] == [(2, 15.0), (4, 15.0), (4, 15.0)]
    assert "step" not in scalars and "time" not in scalars
    for record in store.records:  # the JSON lines and TensorBoard say the same
        for name, value in record.items():
            if name != "step":
                assert (record["step"], pytest.approx(value)) in scalars[name], (name, record)


def test_the_training_block_and_the_environment_turn_it_on(tmp_path: Path) -> None:
    raw = {"parties": {"dc0": {"workers": 1}}, "training": {"tensorboard": True}}
    assert topology_from_dict(raw).training.tensorboard
    assert not topology_from_dict({"parties": {"dc0": {"workers": 1}}}).training.tensorboard
    with pytest.raises(ConfigError, match=r"training\.tensorboard must be bool"):
        topology_from_dict({**raw, "training": {"tensorboard": "yes"}})
    path = tmp_path / "job.yaml"
    path.write_text("parties: {dc0: {workers: 1}}\n")
    env = {"GEOMX_ROLE": "worker", "GEOMX_PARTY": "dc0", "GEOMX_TOPOLOGY": str(path), "GEOMX_SCHEDULER": "h:1",
           "GEOMX_GLOBAL_SCHEDULER": "h:2", "GEOMX_TENSORBOARD": "1"}
    assert node_config_from_env(env).topology.training.tensorboard
