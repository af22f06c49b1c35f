"""Combinations decided at run time fail with a message naming them, never a hang: DGT with a WAN codec, and
TSEngine with MixedSync."""

from __future__ import annotations

import yaml
from harness import write_topology

SCRIPT = '''
import os
import sys

import geomx
from geomx.transport.rpc import RemoteError

kind = sys.argv[1]
try:
    kv = geomx.kv.create(kind)
    if kv.is_master_worker:
        kv.set_gradient_compression({"type": "fp16"})
    outcome = "accepted"
except RemoteError as exc:
    outcome = str(exc)
with open(os.path.join(os.environ["GEOMX_RUN_DIR"], "outcome.txt"), "w") as handle:
    handle.write(outcome)
sys.exit(0 if outcome == "accepted" else 3)
'''


def job_with(geomx_job, tmp_path, name, block, kind):
    path = write_topology(tmp_path / f"{name}.yaml", parties={"dc0": 1}, timeouts={"request": "20s", "round": "20s"})
    raw = yaml.safe_load(path.read_text())
    raw.update(block)
    path.write_text(yaml.safe_dump(raw))
    script = tmp_path / "configure.py"
    script.write_text(SCRIPT)
    job = geomx_job(script, kind, topology=path, name=name)
    return job, (job.run_dir / "outcome.txt").read_text()


def test_dgt_refuses_a_wan_codec(geomx_job, tmp_path):
    job, outcome = job_with(geomx_job, tmp_path, "dgt-codec", {"dgt": True}, "dist_sync")
    assert job.result.exit_code != 0
    assert "DGT (ENABLE_DGT) does not combine with WAN compression" in outcome, outcome


def test_tsengine_refuses_mixed_sync(geomx_job, tmp_path):
    job, outcome = job_with(geomx_job, tmp_path, "ts-async", {"tsengine": True}, "dist_async")
    assert job.result.exit_code != 0
    assert "TSEngine (ENABLE_INTER_TS) works with dist_sync" in outcome, outcome
