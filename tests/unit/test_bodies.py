"""Typed message bodies (geomx.protocol.bodies; ESync's in geomx.algorithms.esync.bodies): round trips through JSON
and precise errors for bad bodies."""

from __future__ import annotations

import json

import pytest

from geomx.algorithms.esync.bodies import StateReport, StepAssignment
from geomx.protocol.bodies import BodyError, ConfigureBody, InitBody, PullBody, decode_body, encode_body


@pytest.mark.parametrize("body", [InitBody(shard=2), ConfigureBody(sync="dist_async"),
                                  ConfigureBody(optimizer={"name": "sgd", "params": {"lr": 0.1}}),
                                  StateReport({"dc0/worker0": 0.02, "dc1/worker0": 1.0}, base_steps=4),
                                  StepAssignment({"dc0/worker0": 6}), PullBody(held=True)])
def test_a_body_survives_json(body: object) -> None:
    assert decode_body(type(body), json.loads(json.dumps(encode_body(body)))) == body


def test_unset_fields_stay_off_the_wire_and_ints_pass_as_seconds() -> None:
    assert encode_body(ConfigureBody(sync="dist_sync")) == {"sync": "dist_sync"}
    assert decode_body(StateReport, {"seconds_per_step": {"w": 1}, "base_steps": 2}).seconds_per_step == {"w": 1.0}


@pytest.mark.parametrize(("cls", "body", "error"), [
    (InitBody, None, "InitBody: expected a JSON object body, got NoneType"),
    (InitBody, {}, "InitBody: missing key 'shard'"),
    (InitBody, {"shard": "0"}, "InitBody.shard: expected int, got str '0'"),
    (InitBody, {"shard": True}, "InitBody.shard: expected int, got a bool"),
    (InitBody, {"shard": 0, "shrad": 1},
     r"InitBody: unknown key\(s\) \['shrad'\]; valid: \['digest', 'numel', 'shard'\]"),
    (InitBody, {"shard": 0, "numel": 2.5}, "InitBody.numel: expected int"),
    (StateReport, {"seconds_per_step": [0.1], "base_steps": 1}, "StateReport.seconds_per_step: expected an object"),
    (StateReport, {"seconds_per_step": {"w": "fast"}, "base_steps": 1},
     r"StateReport.seconds_per_step\['w'\]: expected float, got str"),
    (StepAssignment, {"steps": {"w": 2.5}}, r"StepAssignment.steps\['w'\]: expected int, got float"),
    (ConfigureBody, {"sync": 3}, "ConfigureBody.sync: expected str, got int"),
    (PullBody, {"held": 1}, "PullBody.held: expected bool, got int"),
    (PullBody, {"hold": True}, r"PullBody: unknown key\(s\) \['hold'\]"),
])
def test_a_bad_body_is_refused_naming_the_key(cls: type, body: object, error: str) -> None:
    with pytest.raises(BodyError, match=error):
        decode_body(cls, body)  # type: ignore[arg-type]
