"""The central party of `lan: server` beside a `geomx launch --global-only` tier (docs/deployment.md, "Several
hosts"): `--party dc0 --join` starts dc0's own processes and joins the tier. Without `--join` there was no way: a
`--party dc0` launch started a second global tier and was refused (`cannot listen at H:P: Address already in
use`), although the tier's own line said to start every party against it."""

from __future__ import annotations

import io
import subprocess
import sys
import threading
from typing import Any

from harness import TierOutput, worker_command, write_topology

from geomx.launch import free_port, launch


def test_the_central_party_joins_a_global_only_tier_with_join(tmp_path):
    path = write_topology(tmp_path / "job.yaml", parties={"dc0": 1, "dc1": 1})
    address, run_dir = f"127.0.0.1:{free_port()}", tmp_path / "run"
    tier_out, outs = TierOutput(), {"dc0": io.StringIO(), "dc1": io.StringIO()}
    results: dict[str, Any] = {}
    listening = tier_out.listening  # set once the tier says it listens, or once it has ended

    def run(name: str, **options: Any) -> None:
        try:
            command = [] if name == "tier" else worker_command("train.py")
            results[name] = launch(path, command, run_dir=run_dir, global_scheduler=address,
                                   out=tier_out if name == "tier" else outs[name], **options)
        finally:
            listening.set()

    threads = {"tier": threading.Thread(target=run, args=("tier",), kwargs={"global_only": True})}
    threads["tier"].start()
    assert listening.wait(timeout=120) and threads["tier"].is_alive(), tier_out.getvalue()
    assert "the central one with --join too" in tier_out.getvalue()
    threads["dc0"] = threading.Thread(target=run, args=("dc0",), kwargs={"party": "dc0", "join": True})
    threads["dc1"] = threading.Thread(target=run, args=("dc1",), kwargs={"party": "dc1"})
    for name in ("dc0", "dc1"):
        threads[name].start()
    for thread in threads.values():
        thread.join(timeout=240)
    texts = {name: out.getvalue() for name, out in (("tier", tier_out), *outs.items())}
    assert {name: results[name].exit_code for name in results} == {"tier": 0, "dc0": 0, "dc1": 0}, texts
    assert "[global_scheduler]" not in texts["dc0"] and "cannot listen" not in texts["dc0"], texts["dc0"]


def test_join_without_party_and_scheduler_is_one_line(tmp_path):
    path = write_topology(tmp_path / "job.yaml", parties={"dc0": 1, "dc1": 1})
    done = subprocess.run([sys.executable, "-m", "geomx.cli", "launch", str(path), "--join", "--", "true"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.startswith("geomx launch: --join starts one party's processes"), \
        done.stderr
