"""The real example end to end: examples/cnn.py on the digits data over an emulated WAN."""

from __future__ import annotations

import re

import pytest
from harness import EXAMPLES_DIR, REPO_ROOT

from geomx.runs.report import build_report

DEMO_LINKS = {"lan": {"bandwidth": "10Gbit", "latency": "0ms"}, "wan": {"bandwidth": "100Mbit", "latency": "25ms"}}
EPOCHS = 8


@pytest.mark.slow
def test_cnn_example_learns_digits_over_emulated_wan(geomx_job, tmp_path):
    job = geomx_job(EXAMPLES_DIR / "cnn.py", "--epochs", str(EPOCHS), links=DEMO_LINKS)
    job.assert_ok()
    record = job.summary["last_metrics"]["dc0_worker0"]
    assert record["epoch"] == EPOCHS
    assert record["test_accuracy"] >= 0.94, record  # 0.961 (deterministic: FSA), minus 7 of the 360 test digits
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
    # the WAN column is the job's too, to the byte: the summary's (the master's last epoch record read the global
    # servers before the shutdown round)
    assert row["wan_mb"] == round(job.summary["wan_bytes"] / 1e6, 6) and row["wan_mb"] >= record["wan_mb"], row
    assert row["final_accuracy"] == round(record["test_accuracy"], 6)


# Every synchronization algorithm and lossless-enough codec learns the digits, each to a bar of what it reaches
# minus a margin. Synchronous runs (FSA, HFA) are deterministic up to the servers' summation order (several
# FSA jobs here ended at exactly 0.9611): their margin is 0.02 (7 of the 360 test digits). Asynchronous ones
# (MixedSync, DCASGD, ESync's timed step counts) depend on the machine's load: their margin covers the lowest
# accuracy seen. Seen 2026-11-24 on the 2-core machine at load average 30-47 (and the README's figures):
# FSA 0.961, HFA 0.953, HFA + outer 0.944, ESync 0.947, fp16 0.961, int8 + EF 0.964, MixedSync 0.975 (README
# 0.91), DCASGD 12 epochs 0.961 (8 epochs: 0.87-0.95). No link emulation here: accuracy does not depend on
# it, and CI time does.
# Those figures are two parties of two workers at batch 32. Most runs here have one worker per party at batch 64
# (ONE_PER_PARTY): the same global batch and the same number of steps, each party's push or model the result of
# the same 64 samples, at half the processes and half the CPU. Seen so (2026-12, load average 8-13): fp16
# 0.964, int8 + EF 0.958, HFA 0.958, HFA + outer 0.922, MixedSync 0.922, DCASGD 0.956, ESync 0.947. Several
# workers per party stay in the demo above (FSA) and in hfa_outer_streaming, whose bar tells streaming from
# plain outer sync only with two workers per party (one per party: streaming 0.917, plain 0.922).
ONE_PER_PARTY = {"parties": {"dc0": 1, "dc1": 1}}
# Under MixedSync each party evaluates the global model as it pulled it last, and asynchronous pushes at DCASGD's
# lr 0.3 make consecutive models differ: one CI run ended dc0 at 0.847 (0.953 an epoch before) while dc1 read 0.975
# (six runs after it: dc0 0.922-0.961). Their bar is the better of the two parties' last evaluations.
ASYNCHRONOUS = {"mixed_sync", "mixed_sync_dcasgd"}
ALGORITHMS = {  # name: (script, arguments, topology options, accuracy bar)
    "mixed_sync": ("cnn.py", ["--mixed-sync"], ONE_PER_PARTY, 0.89),
    # asynchrony makes DCASGD's accuracy after 8 epochs depend on the machine's load (0.87-0.95 seen): 12 epochs
    "mixed_sync_dcasgd": ("cnn.py", ["--mixed-sync", "--dcasgd", "--lr", "0.3", "--momentum", "0", "--epochs", "12"],
                          ONE_PER_PARTY, 0.91),
    "hfa": ("cnn_hfa.py", [], {"hfa": {"k1": 4, "k2": 5}, **ONE_PER_PARTY}, 0.93),
    # the global model after its 4th global round (cnn_hfa.py evaluates nothing else): 0.886 seen with two
    # workers per party, 0.922 with one; outer Nesterov (lr 0.7, momentum 0.9) starts slower than plain averaging
    "hfa_outer": ("cnn_hfa.py", ["--outer"], {"hfa": {"k1": 4, "k2": 5}, **ONE_PER_PARTY}, 0.90),
    # streaming outer sync: two fragments, overlapped by one local round, mixed half and half; the job's model
    # (each fragment's last global model, pulled from the local server) after the 4th global round: 0.933 seen
    # (0.900 in every run seen while fragments were dealt slice by slice), 0.886 without streaming (two parties of
    # two workers: sums in any order are equal, so the run is deterministic): the bar tells the two apart
    "hfa_outer_streaming": ("cnn_hfa.py", ["--outer"], {"hfa": {"k1": 4, "k2": 5}, "training": {
        "fragments": 2, "fragment_delay": 1, "fragment_alpha": 0.5}}, 0.89),
    "esync": ("cnn_esync.py", ["--rounds", "12", "--slow-rank", "1", "--slowdown", "3"],
              {"hfa": {"k1": 4, "k2": 1}, **ONE_PER_PARTY}, 0.92),
    "fp16": ("cnn_fp16.py", [], ONE_PER_PARTY, 0.94),
    "int8_error_feedback": ("cnn_bsc.py", ["--type", "int8"], ONE_PER_PARTY, 0.94),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_algorithm_learns_digits(geomx_job, name):
    script, args, options, bar = ALGORITHMS[name]
    extra = ["--epochs", str(EPOCHS)] if script != "cnn_esync.py" and "--epochs" not in args else []
    if options.get("parties") == ONE_PER_PARTY["parties"]:
        extra += ["--batch-size", "64"]  # the global batch of two workers per party at 32
    job = geomx_job(EXAMPLES_DIR / script, *extra, *args, name=name, **options)
    job.assert_ok()
    metrics = job.summary["last_metrics"]
    judges = ["dc0_worker0", "dc1_worker0"] if name in ASYNCHRONOUS else ["dc0_worker0"]
    record = max((metrics[judge] for judge in judges), key=lambda m: m["test_accuracy"])
    assert record["test_accuracy"] >= bar, metrics


@pytest.mark.slow
def test_the_ddp_example_learns_digits_in_collective_parties(geomx_job):
    """examples/ddp_torch.py, a torchrun script that keeps its DistributedDataParallel (six lines of geomx), under
    the shipped streaming DiLoCo + int8 topology of two collective parties: DDP makes every inner step, geomx the
    global rounds, and the job learns the digits."""
    job = geomx_job(EXAMPLES_DIR / "ddp_torch.py", "--epochs", str(EPOCHS),
                    topology=REPO_ROOT / "topologies" / "collective_streaming.yaml")
    job.assert_ok()
    epochs = [(int(n), float(acc)) for n, acc in re.findall(r"epoch (\d+)/\d+ .* test accuracy ([\d.]+)", job.output)]
    assert [n for n, _ in epochs] == list(range(1, EPOCHS + 1)), job.tail()
    assert epochs[-1][1] >= 0.9, epochs
