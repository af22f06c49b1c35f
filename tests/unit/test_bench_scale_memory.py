"""The scale bench's memory and CPU figures (issue 23): a rank's extra over plain PyTorch is its peak less plain's, per
model size, and "a model twice the size needs at most twice the memory" compares those extras (the runs are
stubbed: the arithmetic and the report are what is tested)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from geomx.bench import scale

MB = 1_000_000


def _row(config: str, model: int, peak: int) -> dict[str, Any]:
    return {"config": config, "rate": "1Gbit", "h": 100, "model_bytes": model, "rank_rss_over_model": peak / model,
            "utilization": 0.95}


def test_the_scaling_compares_the_extra_over_plain_of_both_sizes(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    half = 100 * MB  # the half model: plain 700 MB at peak, the job 820 MB: 120 MB of extra
    monkeypatch.setattr(scale, "measure_plain", lambda steps, work, preset, step_ms, **_: _row("plain", half, 700 * MB))
    monkeypatch.setattr(scale, "measure", lambda config, rate, h, rounds, work, preset, step_ms, mirror, **_:
                        _row(config, half, 820 * MB))
    whole = 200 * MB  # the model: plain 1300 MB, the job 1530 MB: 230 MB of extra
    section = {"plain": _row("plain", whole, 1300 * MB), "rows": [_row("streaming_int8", whole, 1530 * MB)]}
    figures = scale.measure_scaling(section, "gpt43m", "streaming_int8", "1Gbit", 100, 2, tmp_path, 40.0)
    assert figures["half"]["extra_bytes"] == pytest.approx(120 * MB)
    assert figures["whole"]["extra_bytes"] == pytest.approx(230 * MB)
    assert figures["whole"]["extra_over_model"] == pytest.approx(1.15)
    assert figures["model_ratio"] == pytest.approx(2.0)
    assert figures["extra_ratio"] == pytest.approx(230 / 120)
    assert figures["rank_peak_ratio"] == pytest.approx(1530 / 820)
    text = "\n".join(scale.lines({"setup": {"preset": "gpt85m", "parties": 2, "ranks": 2, "lan": "collective",
                                            "inner_step": "stand-in", "step_ms": 40, "latency": "25ms", "rounds": 2},
                                  **section, "scaling": figures}))
    assert ("a rank's extra over plain PyTorch 120 MB (1.20x) with gpt43m, 230 MB (1.15x) with the model 2.00x its "
            "size: 1.92x the extra, 1.87x the rank's peak") in text, text


def test_a_failed_half_run_is_reported_not_divided(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(scale, "measure_plain", lambda *args, **_: {"error": "rank 1 died"})
    monkeypatch.setattr(scale, "measure", lambda *args, **_: _row("streaming_int8", 100 * MB, 820 * MB))
    section = {"plain": _row("plain", 200 * MB, 1300 * MB), "rows": [_row("streaming_int8", 200 * MB, 1530 * MB)]}
    figures = scale.measure_scaling(section, "gpt43m", "streaming_int8", "1Gbit", 100, 2, tmp_path, 40.0)
    assert "extra_ratio" not in figures and figures["errors"] == ["plain gpt43m: rank 1 died"]


def test_cpu_time_per_process_is_in_the_stats_and_the_table(tmp_path: Path) -> None:
    from geomx.runs.runlog import cpu_seconds, read_stats, write_stats

    before = cpu_seconds()
    sum(i * i for i in range(300_000))  # some user time of this process
    after = cpu_seconds()
    assert after["user"] > before["user"] and after["sys"] >= before["sys"] >= 0
    write_stats(tmp_path, "global_server0", {"role": "global_server"})
    stats, = read_stats(tmp_path)
    assert stats["cpu_s"] >= after["user"] + after["sys"] and 0 <= stats["cpu_sys_s"] <= stats["cpu_s"]
    ranks = [{"steps": 10, "step_s": 0.04, "wall_s": 0.5, "overrun_s": 0.0, "durations_s": [0.05] * 10,
              "model_bytes": MB, "params": MB // 4, "peak_rss_bytes": 2 * MB, "loop_cpu_s": {"user": u, "sys": 0.5}}
             for u in (1.0, 2.0)]
    row = {**scale.summarize(ranks, 1), "config": "streaming_int8", "rate": "1Gbit", "h": 100,
           "server_cpu_s": {"global_server0": {"user": 4.25, "sys": 1.0}}}
    assert row["rank_loop_cpu_s"] == {"user": 1.5, "sys": 0.5}  # the mean over ranks
    text = "\n".join(scale.lines({"setup": {"preset": "gpt85m", "parties": 2, "ranks": 2, "lan": "collective",
                                            "inner_step": "stand-in", "step_ms": 40, "latency": "25ms", "rounds": 1},
                                  "rows": [row]}))
    assert "rank loop CPU s" in text and "1.5 + 0.5" in text and "4.2 + 1.0" in text


def test_a_landings_mix_is_device_work_left_out_of_utilization_and_shown_beside_it() -> None:
    """Each rank's ``device_s`` (its landings' mixes, timed on the stand-in's host) is left out of utilization and
    blocked time, as the stand-in's own overrun is; ``utilization_mix_on_host`` counts it as blocked."""
    ranks = [{"steps": 100, "step_s": 0.04, "wall_s": 4.5, "overrun_s": 0.1, "device_s": mix,
              "durations_s": [0.04] * 100, "model_bytes": MB, "params": MB // 4, "peak_rss_bytes": 2 * MB}
             for mix in (0.2, 0.3)]
    row = scale.summarize(ranks, 2)
    assert row["utilization"] == pytest.approx((4.0 / 4.2 + 4.0 / 4.1) / 2)
    assert row["utilization_mix_on_host"] == pytest.approx(4.0 / 4.4)
    assert row["mix_s_per_round"] == pytest.approx(0.125)
    assert row["blocked_s_per_round"] == pytest.approx((0.2 + 0.1) / 2 / 2)
    text = "\n".join(scale.lines({"setup": {"preset": "gpt85m", "parties": 2, "ranks": 2, "lan": "collective",
                                            "inner_step": "stand-in", "step_ms": 40, "latency": "25ms", "rounds": 2},
                                  "rows": [{**row, "config": "streaming", "rate": "1Gbit", "h": 100}]}))
    assert "mix on host" in text and " 0.12 " in text and "90.9%" in text, text


def test_the_staged_path_reaches_the_jobs_topology_and_every_row_says_its_path(monkeypatch: pytest.MonkeyPatch,
                                                                              tmp_path: Path) -> None:
    """``--path staged``: HFA's rounds through the staged host mirror (``training.staged``); every row records the
    path its rounds took (FSA's never take the round machine: ``cpu``)."""
    import yaml

    staged = yaml.safe_load(scale.topology(tmp_path / "s.yaml", "streaming_int8", "1Gbit", 100, "staged").read_text())
    plain = yaml.safe_load(scale.topology(tmp_path / "c.yaml", "streaming_int8", "1Gbit", 100).read_text())
    assert staged["training"]["staged"] is True and "staged" not in plain["training"]
    assert staged["training"]["compression"] == plain["training"]["compression"], "nothing else changes"
    monkeypatch.setattr(scale, "measure_plain", lambda *args, **_: {"error": "not run"})
    monkeypatch.setattr(scale, "measure", lambda config, rate, h, rounds, work, preset, step_ms, mirror="cpu", **_:
                        {"error": "not run"} if config == "fsa" else
                        {**_row(config, MB, 2 * MB), "blocked_s_per_round": 0.5, "path": mirror})
    monkeypatch.setattr(scale, "plot", lambda *args: None)
    section = scale.measure_grid(("blocking",), ("1Gbit",), (100,), 2, tmp_path, fsa_rates=("10Gbit",),
                                 mirror="staged")
    assert section["setup"]["path"] == "staged"
    assert [(row["config"], row["path"]) for row in section["rows"]] == [("blocking", "staged"), ("fsa", "cpu")]
    assert "HFA's rounds through the staged path" in "\n".join(scale.lines(section))


def test_a_cuda_run_says_so_in_every_row_and_runs_the_real_model() -> None:
    assert scale._path("streaming_int8", "staged", "cuda") == scale._path("fsa", "cpu", "cuda") == "cuda"
    assert scale._path("fsa", "staged", "cpu") == "cpu" and scale._path("blocking", "staged", "cpu") == "staged"
    command = scale._worker("gpt85m", 10, 40.0, Path("out"), "geomx", device="cuda")
    assert command[-3:] == ["--real", "--device", "cuda"]
    assert "--real" not in scale._worker("gpt85m", 10, 40.0, Path("out"), "geomx")
