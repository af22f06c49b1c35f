"""geomx report on two recorded runs: the plots exist and the table's numbers are the JSON records'."""

from __future__ import annotations

import json
from pathlib import Path

from geomx.cli import main as cli_main
from geomx.runs.report import build_report
from geomx.runs.runlog import append_metrics, write_stats


def record_run(run_dir: Path, losses: list[float], accuracies: list[float], wan_step: int) -> list[dict]:
    """Metrics as the front end writes them: the master's records carry the job's WAN total."""
    records = []
    for step, loss in enumerate(losses, start=1):
        record = {"step": step * 10, "elapsed_s": step * 0.5, "loss": loss, "lan_bytes": 1000 * step,
                  "wan_bytes": 0, "net_wait_s": 0.01 * step, "wan_bytes_total": wan_step * step}
        if step - 1 < len(accuracies):
            record["accuracy"] = accuracies[step - 1]
        append_metrics(run_dir, "dc0/worker0", record)
        records.append(record)
    append_metrics(run_dir, "dc1/worker0", {"step": 10 * len(losses), "elapsed_s": 1.0, "loss": 9.0,
                                            "lan_bytes": 777, "wan_bytes": 0, "net_wait_s": 0.0})
    # what every process counted when it exited (the launcher's summary adds up the same files)
    for name, lan_sent, wan_sent in (("dc0/worker0", 500, 0), ("dc0/server", 4000, 90), ("dc1/worker0", 300, 0),
                                     ("global_server0", 0, 70)):
        write_stats(run_dir, name, {"role": "x", "party": name[:3], "lan": {"sent": lan_sent, "recv": 1},
                                    "wan": {"sent": wan_sent, "recv": 1}})
    return records


def test_report_on_two_runs_writes_plots_and_a_matching_table(tmp_path):
    fsa = record_run(tmp_path / "fsa", [2.3, 1.5, 0.9], [0.4, 0.7, 0.8], wan_step=3_000_000)
    hfa = record_run(tmp_path / "hfa", [2.3, 1.9, 1.2, 1.0], [0.3, 0.5, 0.75, 0.7], wan_step=400_000)
    out = tmp_path / "report"
    code = cli_main(["report", str(tmp_path / "fsa"), str(tmp_path / "hfa"), "--out", str(out)])
    assert code == 0
    for name in ("loss.png", "accuracy.png", "wan_bytes.png"):
        data = (out / name).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 5000, name
    rows = json.loads((out / "report.json").read_text())["rows"]
    for row, records in zip(rows, (fsa, hfa), strict=True):
        assert row["worker"] == "dc0_worker0"  # the master (it carries the job's WAN total)
        assert row["steps"] == records[-1]["step"]
        assert row["final_loss"] == records[-1]["loss"]
        assert row["final_accuracy"] == records[-1]["accuracy"]
        assert row["best_accuracy"] == max(r["accuracy"] for r in records)
        # the job's, from the stats files as the launcher's summary adds them up (not the master's last record)
        assert row["wan_mb"] == (90 + 70) / 1e6
        assert row["lan_mb"] == (500 + 4000 + 300) / 1e6  # the job's, each byte once (by its sender)
        assert row["wall_s"] == records[-1]["elapsed_s"]
    table = (out / "report.md").read_text().splitlines()
    assert table[0].startswith("| run | worker | steps")
    assert table[2].split(" | ")[:3] == ["| fsa", "dc0_worker0", "30"]
    assert "| 0.7 | 0.75 | 0.00016 |" in table[3]  # hfa: final accuracy, best accuracy, WAN MB
    assert any(line.startswith("- `lan_mb`: the whole job's LAN traffic") for line in table)  # each column's meaning
    assert sum(line.startswith("- `") for line in table) == len(rows[0])


def test_report_names_a_folder_without_metrics(tmp_path, capsys):
    assert cli_main(["report", str(tmp_path), "--out", str(tmp_path / "r")]) == 2
    assert "has no metrics" in capsys.readouterr().out


def test_report_names_an_out_that_is_a_file(tmp_path, capsys):
    record_run(tmp_path / "fsa", [2.3, 1.5], [0.4, 0.7], wan_step=3_000_000)
    taken = tmp_path / "notes.txt"
    taken.write_text("mine")
    assert cli_main(["report", str(tmp_path / "fsa"), "--out", str(taken)]) == 2  # FileExistsError was a traceback
    assert f"--out {taken} is a file" in capsys.readouterr().out
    assert taken.read_text() == "mine"


def test_build_report_accepts_the_examples_epoch_records(tmp_path):
    append_metrics(tmp_path / "run", "dc0/worker0", {"epoch": 1, "steps": 12, "loss": 1.0, "test_accuracy": 0.5,
                                                     "wan_mb": 2.5, "elapsed_s": 3.0})
    rows = build_report([tmp_path / "run"], tmp_path / "out")
    assert rows[0]["final_accuracy"] == 0.5 and rows[0]["steps"] == 12
    # no process has written its counters: unknown, not 0 (the record's wan_mb is a point of the curve only)
    assert rows[0]["lan_mb"] is None and rows[0]["wan_mb"] is None


def test_a_process_restarted_under_the_same_name_keeps_its_predecessors_count(tmp_path):
    """A party restarted into the same run folder: its processes' names are the dead ones'. Each keeps a file of
    its own, and the totals count both (before, the new file replaced the dead one's bytes)."""
    import os

    from geomx.runs.runlog import StatsFile, read_stats, stats_path
    from geomx.runs.summary import traffic

    dead = stats_path(tmp_path, "dc1/server")
    dead.parent.mkdir(parents=True)
    dead.write_text(json.dumps({"name": "dc1/server", "pid": os.getpid() + 1, "party": "dc1", "final": False,
                                "lan": {"sent": 10, "recv": 0}, "wan": {"sent": 300, "recv": 0}}))
    counts = {"party": "dc1", "lan": {"sent": 5, "recv": 0}, "wan": {"sent": 40, "recv": 0}}
    stats = StatsFile(tmp_path, "dc1/server", lambda: counts).start()
    stats.flush()  # a rewrite goes to its own file again
    stats.close()
    assert sorted(p.name for p in (tmp_path / "stats").glob("*.json")) == ["dc1_server.1.json", "dc1_server.json"]
    totals = traffic(read_stats(tmp_path))
    assert (totals["lan_bytes"], totals["wan_bytes"]) == (15, 340)
    assert totals["wan_bytes_sent_by_process"] == {"dc1/server": 340}


def test_a_run_of_decoupled_rounds_reports_them_and_a_run_without_shows_dashes(tmp_path):
    record_run(tmp_path / "sync", [2.0, 1.0], [], wan_step=10)
    record_run(tmp_path / "quorum", [2.0, 1.5], [], wan_step=10)
    outer = {"rounds": 12, "closed_by_grace": 4, "on_time": {"dc0/server": 12, "dc1/server": 8},
             "missed": {"dc1/server": 4}, "late_folded": {"dc1/server": 3}, "dropped": {"dc1/server": 1},
             "lost": {"dc1/server": 2}}
    write_stats(tmp_path / "quorum", "global_server0", {"role": "x", "party": "dc0", "lan": {"sent": 0, "recv": 0},
                                                        "wan": {"sent": 70, "recv": 1}, "outer_rounds": outer})
    rows = build_report([tmp_path / "sync", tmp_path / "quorum"], tmp_path / "report")
    assert [(r["outer_rounds"], r["outer_missed"], r["outer_folded"], r["outer_dropped"], r["outer_lost"])
            for r in rows] == [(None, None, None, None, None), (12, 4, 3, 1, 2)]
    table = (tmp_path / "report" / "report.md").read_text().splitlines()
    assert table[0].endswith("| outer_rounds | outer_missed | outer_folded | outer_dropped | outer_lost |")
    assert table[2].endswith("| - | - | - | - | - |") and table[3].endswith("| 12 | 4 | 3 | 1 | 2 |")
    only_sync = build_report([tmp_path / "sync"], tmp_path / "report-sync")
    assert "outer_rounds" not in only_sync[0]  # no columns for what no run has
