"""The lan section's rows from tiers run in turns: each ratio is the median of the turns' own ratios (tiers measured
side by side), each tier's figure the median of its turns; a failed turn drops out of both."""

from __future__ import annotations

from geomx.bench import lan


def _ms(median: float) -> dict[str, float]:
    return {"median_ms": median, "mean_ms": median + 1, "params": 5, "steps": 25, "cpu_ms": median * 2}


def test_ratios_are_the_median_of_each_turns_ratio_not_a_ratio_of_medians() -> None:
    # the machine slows between turns: ddp 100 -> 130 -> 110, collective 104 -> 137 -> 112
    runs = {"ddp": [_ms(100), _ms(130), _ms(110)], "collective": [_ms(104), _ms(137), _ms(112)],
            "server": [_ms(200), _ms(210), _ms(205)]}
    row = lan.combine("mlp", 2, runs)
    assert row["collective"]["median_ms"] == 112 and row["ddp"]["median_ms"] == 110
    assert row["collective"]["turns_ms"] == [104, 137, 112]
    turns = [104 / 100, 137 / 130, 112 / 110]
    assert row["collective_over_ddp_turns"] == turns
    assert row["collective_over_ddp"] == sorted(turns)[1]  # 1.04, not 112 / 110 = 1.018
    assert row["server_over_collective"] == sorted([200 / 104, 210 / 137, 205 / 112])[1]
    text = "\n".join(lan.lines({"setup": {"steps": 30, "warmup": 5, "host": "loopback", "optimizer": "SGD",
                                          "repeats": 3}, "rows": [row]}))
    assert "1.04x" in text and "3 turns" in text
    assert row["collective"]["cpu_ms"] == 224 and "220 / 224 / 410" in text  # each tier's CPU per step
    assert "goal (lan, mlp, 2 ranks): collective step <= 1.05x DDP's: 1.04x -> met" in text
    assert "goal (lan, mlp, 2 ranks): server tier's step >= 2x the collective's: 1.83x -> NOT met" in text


def test_a_failed_turn_drops_out_of_the_figures_and_the_ratios() -> None:
    runs = {"ddp": [_ms(100), {"error": "rank 1 died"}], "collective": [_ms(120), _ms(90)]}
    row = lan.combine("mlp", 2, runs)
    assert row["ddp"]["turns_ms"] == [100] and row["collective"]["median_ms"] == 105
    assert row["collective_over_ddp_turns"] == [1.2]
    failed = lan.combine("mlp", 2, {"ddp": [{"error": "x"}], "collective": [_ms(1)]})
    assert failed["ddp"] == {"error": "x"} and "collective_over_ddp" not in failed


def test_each_tier_runs_its_worker_and_topology(tmp_path) -> None:
    """ddp and plain run the worker as themselves; every other tier is the wrapper in a one-party job, HFA's with the
    outer optimizer, and the _ddp one with the script's own DDP around the model."""
    import yaml

    def args(tier: str) -> list[str]:
        return lan._worker_args("mlp", 10, tmp_path / "out.json", tier, "cpu", "sgd")

    assert args("ddp")[args("ddp").index("--tier") + 1] == "ddp" and "--ddp" not in args("ddp")
    assert args("collective")[args("collective").index("--tier") + 1] == "geomx" and "--ddp" not in args("collective")
    assert "--ddp" in args("collective_hfa_ddp") and "--ddp" not in args("collective_hfa")
    assert "--ddp" in args("collective_ddp")
    for tier, lan_tier, hfa in (("collective", "collective", False), ("collective_ddp", "collective", False),
                                ("server_hfa", "server", True),
                                ("collective_hfa_ddp", "collective", True)):
        raw = yaml.safe_load(lan._topology(tmp_path / f"{tier}.yaml", 2, tier).read_text())
        assert raw["parties"]["dc0"] == {"workers": 2, "lan": lan_tier}, tier
        assert ("hfa" in raw) is hfa and (raw.get("training") == {"server_optimizer": "outer_nesterov"}) is hfa, tier
