"""The scale bench's memory figures (issue 23): a rank's extra over plain PyTorch is its peak less plain's, per
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
    monkeypatch.setattr(scale, "measure_plain", lambda steps, work, preset, step_ms: _row("plain", half, 700 * MB))
    monkeypatch.setattr(scale, "measure", lambda config, rate, h, rounds, work, preset, step_ms:
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
    monkeypatch.setattr(scale, "measure_plain", lambda *args: {"error": "rank 1 died"})
    monkeypatch.setattr(scale, "measure", lambda *args: _row("streaming_int8", 100 * MB, 820 * MB))
    section = {"plain": _row("plain", 200 * MB, 1300 * MB), "rows": [_row("streaming_int8", 200 * MB, 1530 * MB)]}
    figures = scale.measure_scaling(section, "gpt43m", "streaming_int8", "1Gbit", 100, 2, tmp_path, 40.0)
    assert "extra_ratio" not in figures and figures["errors"] == ["plain gpt43m: rank 1 died"]
