"""The status page of a running job: `geomx launch` prints its URL; /metrics, /status.json and `geomx status` are
read while the workers train (status_loop.py runs until the test writes its stop file).

One job, two parties of two workers (HiPS), a shared secret: the launcher's ``status :`` line is read from its
output, /metrics is scraped twice and parsed with prometheus_client's parser (the WAN counters grow between the
scrapes), /status.json names every party and every member the global scheduler has, and neither shows the secret.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jobkit
import pytest
import yaml
from harness import worker_command, write_topology
from prometheus_client.parser import text_string_to_metric_families

from geomx.launch import LaunchResult, launch

SECRET = "status-page-secret-0042"
WAIT_S = 90.0


class Output(io.TextIOBase):
    """What the launcher writes, readable while it runs (the launcher writes from several threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._text: list[str] = []

    def write(self, text: str) -> int:
        with self._lock:
            self._text.append(text)
        return len(text)

    def getvalue(self) -> str:
        with self._lock:
            return "".join(self._text)


def wait_for(what: str, check: Callable[[], Any], timeout: float = WAIT_S) -> Any:
    """``check()``'s first truthy value, polled until ``timeout``; fails naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    pytest.fail(f"timed out after {timeout:g} s waiting for {what}")


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return answer.read().decode()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


class RunningJob:
    """A whole job launched in a thread; ``stop()`` writes the workers' stop file and waits for the end."""

    def __init__(self, topology: Path, run_dir: Path) -> None:
        self.out = Output()
        self.run_dir = run_dir
        self.result: LaunchResult | None = None
        self._thread = threading.Thread(target=self._run, args=(topology,), daemon=True)
        self._thread.start()

    def _run(self, topology: Path) -> None:
        self.result = launch(topology, worker_command("status_loop.py"), run_dir=self.run_dir, out=self.out)

    def url(self) -> str:
        found = wait_for("the launcher's 'status :' line",
                         lambda: re.search(r"status : (http://\S+/)", self.out.getvalue()))
        return str(found.group(1))

    def stop(self) -> LaunchResult:
        stop = jobkit.out_dir(self.run_dir) / "stop"
        stop.write_text("stop")
        self._thread.join(timeout=WAIT_S)
        print(self.out.getvalue())
        assert self.result is not None, "the job did not end within its wait after the stop file"
        return self.result


@pytest.fixture
def running_job(tmp_path: Path):
    path = write_topology(tmp_path / "status.yaml", parties={"dc0": 2, "dc1": 2})
    raw = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**raw, "security": {"secret": SECRET}}, sort_keys=False))
    job = RunningJob(path, tmp_path / "run")
    try:
        yield job
    finally:
        if job.result is None:
            job.stop()


@pytest.mark.slow
def test_the_status_page_metrics_and_geomx_status_during_a_job(running_job):
    url = running_job.url()
    assert url.startswith("http://127.0.0.1:")

    def status() -> dict[str, Any]:
        return json.loads(fetch(url + "status.json"))

    # the global tier is complete and rounds are being made
    first = wait_for("two global rounds", lambda: (s := status())["job"]["global_round"] and
                     s["job"]["global_round"] >= 2 and s)
    before = samples(fetch(url + "metrics"))
    wait_for("five more global rounds",
             lambda: status()["job"]["global_round"] >= first["job"]["global_round"] + 5)
    text = fetch(url + "metrics")
    after = samples(text)
    for party in ("dc0", "dc1"):
        for direction in ("sent", "recv"):
            key = ("geomx_wan_bytes_total", (("direction", direction), ("party", party)))
            assert after[key] > before[key] > 0, (party, direction, before[key], after[key])
        age = ("geomx_heartbeat_age_seconds", (("party", party), ("rank", "0"), ("role", "local_server")))
        assert 0 <= after[age] < 10
        state = ("geomx_member_state", (("party", party), ("rank", "0"), ("role", "local_server"), ("state",
                                                                                                 "training")))
        assert after[state] == 1
    assert after[("geomx_global_rounds_total", ())] > before[("geomx_global_rounds_total", ())]

    data = status()
    assert data["job"]["phase"] == "training" and data["job"]["algorithm"] == "dist_sync"
    members = {party["name"]: sorted(m["name"] for m in party["members"]) for party in data["parties"]}
    assert members == {"dc0": ["dc0/server", "global_server0"], "dc1": ["dc1/server"]}
    assert all(m["state"] == "training" and m["step"] is not None
               for party in data["parties"] for m in party["members"])

    page = fetch(url)
    assert "id='party-dc0'" in page and "id='party-dc1'" in page
    assert not any(SECRET in shown for shown in (page, text, json.dumps(data)))

    host_port = url.removeprefix("http://").rstrip("/")
    shown = subprocess.run([sys.executable, "-m", "geomx.cli", "status", host_port], capture_output=True,
                           text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    for name in ("dc0 (central)", "dc1", "global_server0", "dc0/server", "dc1/server", "dist_sync"):
        assert name in shown.stdout, (name, shown.stdout)

    result = running_job.stop()
    assert result.exit_code == 0, running_job.out.getvalue()[-3000:]
    # the page stops with the scheduler
    with pytest.raises(OSError):
        fetch(url)


def test_geomx_status_names_an_address_nothing_answers_at(reserved_port):
    address = f"127.0.0.1:{reserved_port()}"  # held, never listening: refused at once
    shown = subprocess.run([sys.executable, "-m", "geomx.cli", "status", address, "--timeout", "5"],
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 2
    assert f"geomx status: cannot read the status of http://{address}/status.json" in shown.stderr
