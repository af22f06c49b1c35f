"""Two party launchers (``geomx launch --party``) of one job sharing one run folder, as on two hosts with a shared
filesystem: each launcher's summary describes the processes it started, ``geomx report`` the whole job.

Before: each launcher's summary read every stats file written since it started, so it added the other party's
bytes to its own and named the other launcher's processes (when still running) as stopped before a clean exit.
"""

from __future__ import annotations

import io
import threading

import pytest
from harness import worker_command, write_topology

from geomx.launch import LaunchResult, format_summary, launch
from geomx.runs.report import build_report

JOIN_S = 180.0  # each launcher ends by itself well before (its register/round/shutdown timeouts are under this)


def test_party_launchers_sharing_a_run_folder_each_summarize_their_own(tmp_path, reserved_port):
    topology = write_topology(tmp_path / "shared.yaml", parties={"dc0": 1, "dc1": 1})
    run_dir = tmp_path / "run"  # one folder for both launchers
    global_scheduler = f"127.0.0.1:{reserved_port()}"
    command = worker_command("traffic_loop.py", "--steps", "5")
    results: dict[str, LaunchResult] = {}
    outputs = {party: io.StringIO() for party in ("dc0", "dc1")}
    errors: dict[str, BaseException] = {}

    def launch_party(party: str) -> None:
        try:
            results[party] = launch(topology, command, run_dir=run_dir, out=outputs[party], party=party,
                                    global_scheduler=global_scheduler)
        except BaseException as exc:
            errors[party] = exc

    threads = [threading.Thread(target=launch_party, args=(party,), daemon=True) for party in ("dc1", "dc0")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_S)
    assert not any(thread.is_alive() for thread in threads), "a launcher did not end"
    assert not errors, errors
    for party, result in results.items():
        assert result.exit_code == 0, f"{party}: {format_summary(result)}\n{outputs[party].getvalue()[-3000:]}"

    dc0, dc1 = results["dc0"].summary, results["dc1"].summary
    central = ["dc0/scheduler", "dc0/server", "dc0/worker0", "global_scheduler", "global_server0"]
    assert dc0["processes_reporting"] == 5 and dc0["other_processes"] == ["dc1/scheduler", "dc1/server",
                                                                          "dc1/worker0"], dc0
    assert dc1["processes_reporting"] == 3 and dc1["other_processes"] == central, dc1
    assert dc0["not_final"] == [] and dc1["not_final"] == []  # each launcher's own processes ended cleanly
    assert set(dc1["wan_bytes_sent_by_party"]) == {"dc1"} and dc1["wan_bytes"] > 0  # its local server's stream
    assert set(dc0["wan_bytes_sent_by_party"]) == {"dc0"}  # the global tier's replies to dc1
    assert list(dc0["last_metrics"]) == ["dc0_worker0"] and dc1["last_metrics"] == {}  # (the master records)
    text = format_summary(results["dc1"])
    assert "counted until" not in text and "other launches: left out (dc0/scheduler" in text, text

    # geomx report: the whole job, both launchers' processes
    [row] = build_report([run_dir], tmp_path / "report")
    assert row["wan_mb"] == pytest.approx((dc0["wan_bytes"] + dc1["wan_bytes"]) / 1e6)
    assert row["lan_mb"] == pytest.approx((dc0["lan_bytes"] + dc1["lan_bytes"]) / 1e6)
