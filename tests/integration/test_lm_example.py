"""examples/lm.py, the wrapper's second workload, lowers its validation loss under FSA (also with float16 autocast
and a GradScaler) and under HFA + outer (in float32, and in bfloat16 with the WAN in bfloat16 too)."""

from __future__ import annotations

import pytest
from harness import EXAMPLES_DIR

from geomx.runs.runlog import read_metrics

SMALL = ("--steps", "24", "--dim", "32", "--context", "32", "--batch-size", "16", "--max-chars", "200000",
         "--eval-every", "24", "--eval-batches", "4", "--lr", "0.01")


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["fsa", "fsa-amp", "hfa-outer", "hfa-outer-bfloat16"])
def test_lm_lowers_its_validation_loss(geomx_job, monkeypatch, algorithm):
    options = {}
    dtype = ("--dtype", "bfloat16") if algorithm.endswith("bfloat16") else ()
    if dtype:
        monkeypatch.setenv("GEOMX_COMPRESSION", "bf16")
    amp = ("--amp",) if algorithm.endswith("amp") else ()
    if amp:  # a GradScaler needs the optimizer on the workers
        monkeypatch.setenv("GEOMX_SERVER_OPTIMIZER", "none")
    if algorithm.startswith("hfa-outer"):  # chosen by the topology and the environment; lm.py is the same
        options["hfa"] = {"k1": 2, "k2": 2}
        monkeypatch.setenv("GEOMX_SERVER_OPTIMIZER", "outer_nesterov")
    clip = ("--clip", "1.0") if algorithm.startswith("fsa") else ()  # the job's mean gradient, clipped before a step
    job = geomx_job(EXAMPLES_DIR / "lm.py", *SMALL, *clip, *dtype, *amp, parties={"dc0": 1, "dc1": 1}, **options)
    job.assert_ok()
    all_records = read_metrics(job.run_dir)["dc0_worker0"]
    expected = "hierarchical frequency aggregation" if algorithm.startswith("hfa-outer") else "local optimizer"
    assert expected in all_records[0]["plan"], all_records[0]
    records = [r for r in all_records if "val_loss" in r]
    assert len(records) == 2, records  # step 0 and the last step
    first, last = records[0]["val_loss"], records[-1]["val_loss"]
    assert last < first - 0.5, (first, last)
    assert records[-1]["accuracy"] > records[0]["accuracy"]
    if algorithm.startswith("hfa-outer"):
        assert "outer_nesterov" in all_records[0]["plan"]
    if dtype:
        assert "bf16" in all_records[0]["plan"], all_records[0]["plan"]
