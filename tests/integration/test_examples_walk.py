"""The examples as docs/algorithms.md runs them: what they print and what they refuse.

examples/cnn_hfa.py under ``--epochs`` ends at its last global round, and its final line says the steps of the
model it evaluated. Why: it trained the epochs' remaining local steps past the last global round (8 of the demo's
88), which reach no global model, and printed "final test accuracy 0.9417 after 88 steps" for the global model of
step 80 (its summary said steps=80).
"""

from __future__ import annotations

import re

import pytest
from harness import EXAMPLES_DIR


@pytest.mark.slow
def test_cnn_hfa_epochs_end_at_the_last_global_round(geomx_job) -> None:
    # 1437 training digits, 2 workers, batch 64: 11 local steps; K1 x K2 = 4: two global rounds, 8 steps
    job = geomx_job(EXAMPLES_DIR / "cnn_hfa.py", "--epochs", "1", "--batch-size", "64",
                    parties={"dc0": 1, "dc1": 1}, hfa={"k1": 2, "k2": 2})
    job.assert_ok()
    record = job.summary["last_metrics"]["dc0_worker0"]
    assert record["global_round"] == 2 and record["steps"] == 8, record
    final = re.search(r"final test accuracy [\d.]+ after (\d+) steps", job.output)
    assert final is not None and int(final.group(1)) == 8, job.output[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize(("script", "args", "options", "says"), [
    ("cnn.py", ["--mixed-sync", "--slow-party", "dc9"], {}, "--slow-party 'dc9' is not a party of this job"),
    ("cnn_esync.py", ["--slow-rank", "2"], {"hfa": {"k1": 2, "k2": 1}}, "--slow-rank 2 is no worker's global rank"),
])
def test_a_party_or_rank_the_job_lacks_is_one_line(geomx_job, script: str, args: list[str], options: dict,
                                                   says: str) -> None:
    """Why: ``--slow-party dc9`` slowed nobody, silently; ``--slow-rank 9`` the same."""
    job = geomx_job(EXAMPLES_DIR / script, *args, parties={"dc0": 1, "dc1": 1}, **options)
    assert job.result.exit_code != 0, job.tail()
    assert says in job.output and "Traceback" not in job.output, job.tail()


@pytest.mark.slow
def test_an_asynchronous_kvstore_under_hfa_is_refused_at_create(geomx_job) -> None:
    """Why: ``kv.create("dist_ssp")`` (``cnn.py --ssp``) on topologies/hfa.yaml ran, answering gradient pushes with
    HFA's model averages, where docs/algorithms.md says HFA needs a synchronous sync type (the wrapper's
    ``training.sync`` was refused at launch; the kvstore's type reached the servers unchecked)."""
    job = geomx_job(EXAMPLES_DIR / "cnn.py", "--ssp", "--epochs", "1", parties={"dc0": 1, "dc1": 1},
                    hfa={"k1": 2, "k2": 2})
    assert job.result.exit_code != 0, job.tail()
    assert "HFA and ESync average models synchronously: training.sync dist_ssp is not" in job.output, job.tail()


@pytest.mark.slow
def test_a_gradient_loop_refuses_an_hfa_topology(geomx_job) -> None:
    """Why: ``cnn.py`` (or cnn_bsc.py, cnn_mpq.py, cnn_fp16.py) on topologies/hfa.yaml pushed gradients that HFA's
    servers averaged as weights, and trained nothing (test accuracy 0.09), without a word."""
    job = geomx_job(EXAMPLES_DIR / "cnn_bsc.py", "--epochs", "1", parties={"dc0": 1, "dc1": 1},
                    hfa={"k1": 2, "k2": 2})
    assert job.result.exit_code != 0, job.tail()
    assert "cnn_bsc.py pushes gradients every step; the topology's hfa: wants examples/cnn_hfa.py" in job.output
