"""The real example end to end: examples/cnn.py on the digits data over an emulated WAN."""

from __future__ import annotations

import pytest
from harness import EXAMPLES_DIR

from geomx.report import build_report

DEMO_LINKS = {"lan": {"bandwidth": "10Gbit", "latency": "0ms"}, "wan": {"bandwidth": "100Mbit", "latency": "25ms"}}
EPOCHS = 8


@pytest.mark.slow
def test_cnn_example_learns_digits_over_emulated_wan(geomx_job, tmp_path):
    job = geomx_job(EXAMPLES_DIR / "cnn.py", "--epochs", str(EPOCHS), links=DEMO_LINKS)
    job.assert_ok()
    record = job.summary["last_metrics"]["dc0_worker0"]
    assert record["epoch"] == EPOCHS
    assert record["test_accuracy"] >= 0.90, record
    # the WAN emulation was in force: every FSA step waits for dc1's round trip to the global server
    # (2 x 25 ms one way), so no step can be faster than that
    assert record["step_ms"] >= 50.0, record
    # and the model's weights crossed it: ~38k float32 parameters up and down per step
    assert job.summary["wan_bytes"] >= record["steps"] * 2 * 38_000 * 4
    # `geomx report` on the demo's run: the job's LAN traffic is the run summary's (it said 0.0: it added up
    # the workers' own counters, which the examples' epoch records do not carry), the WAN column the job's
    row, = build_report([job.run_dir], tmp_path / "report")
    assert row["worker"] == "dc0_worker0" and row["steps"] == record["steps"]
    assert row["lan_mb"] == round(job.summary["lan_bytes"] / 1e6, 6) and row["lan_mb"] > 1, row
    assert row["wan_mb"] == round(record["wan_mb"], 6) and row["final_accuracy"] == round(record["test_accuracy"], 6)


# Every synchronization algorithm and lossless-enough codec learns the digits (the issues ask for >= 0.88).
# No link emulation here: accuracy does not depend on it, and CI time does.
ALGORITHMS = {
    "mixed_sync": ("cnn.py", ["--mixed-sync"], {}),
    # asynchrony makes DCASGD's accuracy after 8 epochs depend on the machine's load (0.87-0.95 seen): 12 epochs
    "mixed_sync_dcasgd": ("cnn.py", ["--mixed-sync", "--dcasgd", "--lr", "0.3", "--momentum", "0", "--epochs", "12"],
                          {}),
    "hfa": ("cnn_hfa.py", [], {"hfa": {"k1": 4, "k2": 5}}),
    "hfa_outer": ("cnn_hfa.py", ["--outer"], {"hfa": {"k1": 4, "k2": 5}}),
    "esync": ("cnn_esync.py", ["--rounds", "12", "--slow-rank", "3", "--slowdown", "3"], {"hfa": {"k1": 4, "k2": 1}}),
    "fp16": ("cnn_fp16.py", [], {}),
    "int8_error_feedback": ("cnn_bsc.py", ["--type", "int8"], {}),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_algorithm_learns_digits(geomx_job, name):
    script, args, options = ALGORITHMS[name]
    extra = ["--epochs", str(EPOCHS)] if script != "cnn_esync.py" and "--epochs" not in args else []
    job = geomx_job(EXAMPLES_DIR / script, *extra, *args, name=name, **options)
    job.assert_ok()
    record = job.summary["last_metrics"]["dc0_worker0"]
    assert record["test_accuracy"] >= 0.88, record
