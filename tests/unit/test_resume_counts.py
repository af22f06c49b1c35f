"""What a user sees of a resumed job (``geomx launch --resume``): the step counts go on from the checkpoint's step,
the launcher's summary describes its own launch, ``geomx report`` covers the whole job, and the examples resume
their loops. (The real processes: tests/integration/test_resume_counts.py.)

Before: the metrics, the summary, the report and the status page counted a resumed run's steps from 0; the
summary added the interrupted run's counters (and named its processes as not final) and showed its last records
for a refused resume; the report took the first launch's wall time, the last one's loss, and both's bytes;
examples/ddp_torch.py started again at epoch 1; ``--help`` of the examples lost their backslash line breaks.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import time
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import torch

from geomx.runs.report import build_report
from geomx.runs.runlog import stats_path
from geomx.runs.summary import summarize, summary_text
from geomx.torch.metrics import StepRecorder

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


class Store:
    """The kvstore's side of a StepRecorder: its records and the heartbeats' notes (the status page's step)."""

    is_master_worker = False

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.notes: list[int] = []

    def counters(self) -> dict[str, Any]:
        return {}

    def wan_bytes(self) -> int:
        return 0

    def record(self, **metrics: Any) -> None:
        self.records.append(metrics)

    @property
    def pulse(self) -> Store:
        return self

    def note(self, *, step: int | None = None, busy: float | None = None) -> None:
        assert step is not None
        self.notes.append(step)


def test_a_resumed_recorder_counts_the_jobs_steps_from_its_start_step():
    store = Store()
    recorder = StepRecorder(store, every=5, start=40)
    for _ in range(12):
        recorder.log(loss=1.0)
        recorder.step()
    recorder.close()
    assert store.notes == list(range(41, 53))  # the status page's step: the job's
    assert [r["step"] for r in store.records] == [45, 50, 52]  # on the job's multiples of `every`, then the last
    with pytest.raises(ValueError, match="start step"):
        StepRecorder(store, every=5, start=-1)


def write_records(run_dir: Path, name: str, records: list[dict[str, Any]]) -> None:
    """Metrics lines as ``runlog.append_metrics`` writes them, with their own ``time``."""
    folder = run_dir / "metrics"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{name}.jsonl", "a") as handle:
        for record in records:
            handle.write(json.dumps(record) + "\n")


def stats(run_dir: Path, name: str, wan_sent: int, final: bool, at: float) -> None:
    """One process's stats file (a process of its own: a file of its own), last written at ``at``."""
    path = stats_path(run_dir, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"name": name, "pid": -1, "role": "x", "party": name[:3], "final": final,
                                "lan": {"sent": 10, "recv": 0}, "wan": {"sent": wan_sent, "recv": 0}}))
    os.utime(path, (at, at))


def two_launches(run_dir: Path, now: float) -> float:
    """A job interrupted at step 40 (its processes killed: their counts not final), resumed from its checkpoint of
    step 40 an hour later; returns the resumed launch's start."""
    first, second = now - 3600.0, now - 20.0
    write_records(run_dir, "dc0_worker0", [
        {"time": first + 1, "step": 0, "elapsed_s": 0.0, "plan": "fsa"},
        {"time": first + 6, "step": 20, "elapsed_s": 5.0, "loss": 2.0, "net_wait_s": 1.0, "wan_bytes_total": 100},
        {"time": first + 11, "step": 40, "elapsed_s": 10.0, "loss": 1.5, "net_wait_s": 2.0, "wan_bytes_total": 200},
        {"time": second + 1, "step": 40, "elapsed_s": 0.0, "plan": "fsa"},
        {"time": second + 5, "step": 60, "elapsed_s": 4.0, "loss": 1.0, "net_wait_s": 0.5, "wan_bytes_total": 50},
        {"time": second + 9, "step": 80, "elapsed_s": 8.0, "loss": 0.5, "net_wait_s": 1.5, "wan_bytes_total": 90,
         "accuracy": 0.9},
    ])
    for index, name in enumerate(("dc0/worker0", "dc1/worker0", "global_server0")):
        stats(run_dir, name, wan_sent=1000 * (index + 1), final=False, at=first + 12)
    for index, name in enumerate(("dc0/worker0", "dc1/worker0", "global_server0")):  # (own files: .1.json)
        stats(run_dir, name, wan_sent=100 * (index + 1), final=True, at=second + 10)
    return second


def test_the_summary_of_a_resumed_launch_is_of_that_launch(tmp_path):
    started = two_launches(tmp_path, time.time())
    summary = summarize(tmp_path, 9.5, since=started)
    assert summary["wan_bytes"] == 100 + 200 + 300 and summary["processes_reporting"] == 3
    assert summary["not_final"] == []  # the interrupted launch's processes are not this one's
    assert summary["last_metrics"]["dc0_worker0"]["step"] == 80
    text = summary_text(0, None, 9.5, summary)
    assert "counted until" not in text and "earlier runs" in text, text
    whole = summarize(tmp_path, 9.5)  # no start given: every file, as before
    assert whole["wan_bytes"] == 6600 and len(whole["not_final"]) == 3 and not whole["earlier_runs"]


def test_a_refused_resume_shows_no_earlier_workers_lines(tmp_path):
    """The resume is refused (other settings): its processes write their counts, no worker trains a step."""
    started = two_launches(tmp_path, time.time() - 30.0)
    refused = time.time() - 5.0
    stats(tmp_path, "global_server0", wan_sent=0, final=True, at=refused + 1)
    summary = summarize(tmp_path, 1.0, since=refused)
    assert summary["last_metrics"] == {} and summary["wan_bytes"] == 0 and summary["processes_reporting"] == 1
    text = summary_text(1, "global_server0", 1.0, summary)
    assert "dc0_worker0" not in text and "step=" not in text, text
    assert summarize(tmp_path, 1.0, since=started)["last_metrics"]["dc0_worker0"]["step"] == 80


def test_the_report_of_a_resumed_job_covers_every_launch(tmp_path):
    two_launches(tmp_path / "resumed", time.time())
    write_records(tmp_path / "straight", "dc0_worker0", [
        {"time": 1000.0 + t, "step": 10 * t, "elapsed_s": float(t), "loss": 1.0, "wan_bytes_total": t}
        for t in range(1, 4)])
    rows = build_report([tmp_path / "resumed", tmp_path / "straight"], tmp_path / "report")
    resumed, straight = rows
    assert resumed["steps"] == 80  # the job's last step
    assert resumed["wall_s"] == 10.0 + 8.0  # the launches' own times, not the hour between them
    assert resumed["final_loss"] == 0.5 and resumed["final_accuracy"] == 0.9
    assert resumed["net_wait_s"] == 2.0 + 1.5  # each launch counts its waits from 0
    assert resumed["wan_mb"] == (6000 + 600) / 1e6  # every launch's processes' bytes
    assert resumed["launches"] == 2 and straight["launches"] == 1
    assert straight["steps"] == 30 and straight["wall_s"] == 3.0
    series = json.loads((tmp_path / "report" / "report.json").read_text())["series"][0]
    assert [t for t, _ in series["loss"]] == [5.0, 10.0, 14.0, 18.0]  # one time axis: the job's
    assert [v for _, v in series["wan_bytes"]] == [100, 200, 250, 290]  # cumulative over the job
    alone = build_report([tmp_path / "straight"], tmp_path / "report-straight")
    assert "launches" not in alone[0]  # no column where no run folder holds a resumed job


def test_a_second_clock_in_a_workers_file_does_not_split_a_launch(tmp_path):
    """The examples' Progress records (their clock started after the wrapper's) among the wrapper's: one launch."""
    write_records(tmp_path, "dc0_worker0", [
        {"time": 100.0, "step": 0, "elapsed_s": 0.0, "plan": "fsa"},
        {"time": 110.0, "step": 10, "elapsed_s": 10.0, "loss": 1.0},
        {"time": 110.5, "epoch": 1, "steps": 10, "elapsed_s": 2.0, "test_accuracy": 0.5},
        {"time": 120.0, "step": 20, "elapsed_s": 20.0, "loss": 0.5}])
    [row] = build_report([tmp_path], tmp_path / "report")
    assert "launches" not in row and row["wall_s"] == 20.0 and row["steps"] == 20


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.py")), ids=lambda p: p.name)
def test_the_examples_usage_keeps_its_line_continuations(path):
    """``--help`` prints the module docstring: a backslash at a line's end must stay in it, not join the lines."""
    source = path.read_text()
    tree = ast.parse(source)
    docstring = ast.get_docstring(tree, clean=False)
    if docstring is None:
        return
    written = ast.get_source_segment(source, tree.body[0]) or ""  # as in the file: a raw string keeps them all
    assert docstring.count("\\") == written.count("\\"), f"{path.name}: make its docstring raw (r\"\"\"...)"


def load_example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class FakeOptimizer:
    """The wrapper as a resumed job's worker sees it: ``start_step`` from the checkpoint; counts the steps taken."""

    is_master_worker = True

    def __init__(self, optimizer: torch.optim.Optimizer, model: torch.nn.Module, start_step: int) -> None:
        self.optimizer, self.start_step, self.steps = optimizer, start_step, 0

    def zero_grad(self) -> None:
        self.optimizer.zero_grad()

    def step(self) -> None:
        self.steps += 1

    def log(self, **metrics: Any) -> None:
        pass

    def close(self) -> None:
        pass


def run_resumed(module: ModuleType, monkeypatch, argv: list[str], start_step: int) -> list[FakeOptimizer]:
    made: list[FakeOptimizer] = []

    def wrap(optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> FakeOptimizer:
        made.append(FakeOptimizer(optimizer, model, start_step))
        return made[-1]

    from geomx.torch import progress
    fake = SimpleNamespace(DistributedOptimizer=wrap, shard=lambda dataset: dataset, progress=progress,
                           worker_place=lambda: (0, 1), init_process_group=torch.distributed.init_process_group)
    monkeypatch.setattr(module, "gx", fake)
    monkeypatch.setattr("sys.argv", [module.__file__, *argv])
    module.main()
    return made


def test_cnn_torch_resumes_in_its_epoch_after_the_batches_done(monkeypatch, capsys):
    module = load_example("cnn_torch")
    # 1437 training digits (the split's), 256 a batch: 5 batches an epoch; resumed at step 7 (epoch 2, batch 3)
    [opt] = run_resumed(module, monkeypatch, ["--epochs", "3", "--batch-size", "256"], start_step=7)
    per_epoch = len(module.digits_split()[0].labels) // 256
    assert opt.steps == 3 * per_epoch - 7
    assert [line.split()[1] for line in capsys.readouterr().out.splitlines()] == ["2/3", "3/3"]


def test_ddp_torch_resumes_in_its_epoch_after_the_batches_done(monkeypatch, capsys):
    import torch.distributed as dist

    from geomx.cluster.ports import free_port

    module = load_example("ddp_torch")
    for name, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0",
                        "WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(name, value)
    try:
        [opt] = run_resumed(module, monkeypatch, ["--epochs", "3", "--batch-size", "256"], start_step=7)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    per_epoch = len(module.digits_split()[0].labels) // 256
    assert opt.steps == 3 * per_epoch - 7
    assert [line.split()[1] for line in capsys.readouterr().out.splitlines()] == ["2/3", "3/3"]
