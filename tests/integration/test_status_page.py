"""The status page of a running job: `geomx launch` prints its URL; /metrics, /status.json, `geomx status` and the
page in a real browser are read while the workers train (status_loop.py runs until the last test stops it).

One job for the module (its tests run in file order), two parties of two workers (HiPS), checkpoints, a shared
secret: the launcher's ``status :`` line is read from its output, /metrics is scraped twice and parsed with
prometheus_client's parser (the WAN counters grow between the scrapes), /status.json names every party and every
member the global scheduler has, and nothing shows the secret. The browser test (headless Chromium driven by
Selenium; skipped when either is missing) reads the parties' rows from the DOM and saves a screenshot; with
UPDATE_DOCS_SCREENSHOT=1 it also writes docs/images/status.png (the picture in docs/deployment.md).
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
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
from harness import REPO_ROOT, worker_command, write_topology
from prometheus_client.parser import text_string_to_metric_families

from geomx.launch import LaunchResult, launch

SECRET = "status-page-secret-0042"
EVERYONE = {"dc0": ["dc0/server", "dc0/worker0", "dc0/worker1", "global_server0"],
            "dc1": ["dc1/server", "dc1/worker0", "dc1/worker1"]}
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
        self.error: BaseException | None = None  # launch() refused the job
        self._thread = threading.Thread(target=self._run, args=(topology,), daemon=True)
        self._thread.start()

    def _run(self, topology: Path) -> None:
        try:
            self.result = launch(topology, worker_command("status_loop.py"), run_dir=self.run_dir, out=self.out)
        except BaseException as exc:
            self.error = exc
            raise

    def url(self) -> str:
        def line() -> re.Match[str] | None:
            if self.error is not None:
                pytest.fail(f"geomx launch refused the job: {self.error}")
            return re.search(r"status : (http://\S+/)", self.out.getvalue())

        return str(wait_for("the launcher's 'status :' line", line).group(1))

    def stop(self) -> LaunchResult:
        if self.error is not None:
            pytest.fail(f"geomx launch refused the job: {self.error}")
        stop = jobkit.out_dir(self.run_dir) / "stop"
        stop.write_text("stop")
        self._thread.join(timeout=WAIT_S)
        print(self.out.getvalue())
        assert self.result is not None, "the job did not end within its wait after the stop file"
        return self.result


@pytest.fixture(scope="module")
def running_job(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("status-page")
    path = write_topology(folder / "status.yaml", parties={"dc0": 2, "dc1": 2}, training={"compression": "fp16"})
    raw = yaml.safe_load(path.read_text())
    extra = {"security": {"secret": SECRET}, "checkpoint": {"dir": str(folder / "ckpt"), "every_steps": 10}}
    path.write_text(yaml.safe_dump({**raw, **extra}, sort_keys=False))
    job = RunningJob(path, folder / "run")
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

    # the counters travel with the heartbeats (every second): the first scrape once every one has counted some
    grown = [("geomx_wan_bytes_total", (("direction", direction), ("party", party)))
             for party in ("dc0", "dc1") for direction in ("sent", "recv")] + [("geomx_global_rounds_total", ())]
    before = wait_for("WAN bytes and rounds counted", lambda: (m := samples(fetch(url + "metrics"))) and all(
        m.get(key, 0) > 0 for key in grown) and m)
    # the second once every one has grown (within a few heartbeats)
    text = wait_for("every party's WAN counters to grow", lambda: (t := fetch(url + "metrics")) and all(
        samples(t)[key] > before[key] for key in grown) and t, timeout=30)
    after = samples(text)
    for party in ("dc0", "dc1"):
        age = ("geomx_heartbeat_age_seconds", (("party", party), ("rank", "0"), ("role", "local_server")))
        assert 0 <= after[age] < 10
        state = ("geomx_member_state", (("party", party), ("rank", "0"), ("role", "local_server"), ("state",
                                                                                                 "training")))
        assert after[state] == 1
        # each server's rounds, timed: a histogram whose count is the rounds it answered
        count = ("geomx_round_duration_seconds_count", (("party", party), ("rank", "0"), ("role", "local_server")))
        assert after[count] > 0
    count = ("geomx_round_duration_seconds_count", (("party", "dc0"), ("rank", "0"), ("role", "global_server")))
    inf = ("geomx_round_duration_seconds_bucket", (("le", "+Inf"), ("party", "dc0"), ("rank", "0"),
                                                    ("role", "global_server")))
    assert after[inf] == after[count] > 0
    # the WAN codec (fp16) keeps about half of each encoded message off the link
    for party in ("dc0", "dc1"):
        assert after[("geomx_wan_codec_saved_bytes_total", (("party", party),))] > 0, party
    # how far ahead of its round each answer let a party run: always 0 under FSA (SSP's staleness otherwise)
    for party in ("dc0", "dc1"):
        labels = (("party", party), ("rank", "0"), ("role", "local_server"))
        zero = after[("geomx_staleness_rounds_bucket", (("le", "0"), *labels))]
        assert zero == after[("geomx_staleness_rounds_count", labels)] > 0

    # every member: the global tier's own, and each party's workers, relayed by its scheduler and local server
    def everyone() -> dict[str, Any] | None:
        data = status()
        members = {party["name"]: sorted(m["name"] for m in party["members"]) for party in data["parties"]}
        noted = all(m["step"] for party in data["parties"] for m in party["members"])
        return data if members == EVERYONE and noted else None

    data = wait_for(f"every member on the page with its step: {EVERYONE}", everyone)
    assert data["job"]["phase"] == "training" and data["job"]["algorithm"] == "dist_sync"
    assert data["job"]["codec"] == "fp16"
    rows = [m for party in data["parties"] for m in party["members"]]
    assert all(m["state"] == "training" and m["heartbeat_age_s"] < 10 and m["step"] for m in rows), rows
    workers = [m for m in rows if m["role"] == "worker"]
    # the wrapper notes each worker's step and busy share; a party's step is its slowest worker's
    assert all(0 <= m["busy"] <= 1 and m["lan_bytes"]["sent"] > 0 for m in workers), workers
    for party in data["parties"]:
        assert party["step"] == min(m["step"] for m in party["members"] if m["role"] == "worker")
    # FSA gives every party the same model: each worker digests it at steps all digest, relayed up to the page
    model = wait_for("the parties' model digests at a common step", lambda: (m := status()["job"]["model"])[
        "step"] is not None and sorted(m["parties"]) == ["dc0", "dc1"] and m)
    assert model["agree"] and model["disagreements"] == 0, model
    assert len({d for found in model["parties"].values() for d in found}) == 1, model
    relayed = samples(fetch(url + "metrics"))  # the relayed workers are in the metrics too
    assert relayed[("geomx_model_disagreements_total", ())] == 0
    for party in ("dc0", "dc1"):
        labels = (("party", party), ("rank", "1"), ("role", "worker"))
        assert 0 <= relayed[("geomx_busy_ratio", labels)] <= 1 and relayed[("geomx_steps_total", labels)] > 0
        assert relayed[("geomx_model_digest_step", labels)] >= 0

    page = fetch(url)
    assert "id='party-dc0'" in page and "id='party-dc1'" in page
    assert not any(SECRET in shown for shown in (page, text, json.dumps(data)))

    host_port = url.removeprefix("http://").rstrip("/")
    shown = subprocess.run([sys.executable, "-m", "geomx.cli", "status", host_port], capture_output=True,
                           text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    for name in ("dc0 (central)", "dc1", "global_server0", "dc0/server", "dc1/server", "dist_sync"):
        assert name in shown.stdout, (name, shown.stdout)

    # checkpoints every 10 rounds: the page finds the newest one's step in the folder
    checkpoint = wait_for("a checkpoint on the page", lambda: status()["checkpoint"]["step"])
    assert checkpoint >= 10 and checkpoint % 10 == 0


def chromium() -> tuple[str, str] | None:
    """Debian's chromium and its driver (`apt-get install chromium chromium-driver`), if both are here."""
    browser, driver = shutil.which("chromium"), shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


@pytest.mark.slow
@pytest.mark.skipif(chromium() is None, reason="needs Debian's chromium and chromium-driver (apt-get install "
                                               "chromium chromium-driver; .ci/run installs them)")
def test_the_page_in_a_real_browser(running_job, tmp_path):
    webdriver = pytest.importorskip("selenium.webdriver", reason="needs selenium (pip install 'geomx[test]')")
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    url = running_job.url()
    browser, driver_path = chromium()  # type: ignore[misc]
    options = Options()
    options.binary_location = browser
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1100,900"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        driver.set_page_load_timeout(30)
        wait_for("every member on the page", lambda: {p["name"]: sorted(m["name"] for m in p["members"]) for p in
                                                      json.loads(fetch(url + "status.json"))["parties"]} == EVERYONE)
        driver.get(url)
        # read in one script: the page reloads itself every 2 s, which would make elements found one by one stale
        page = driver.execute_script("""
            return {job: document.getElementById('job').innerText, html: document.documentElement.outerHTML,
                    parties: Array.from(document.querySelectorAll('table.party')).map(t => [t.dataset.party,
                        Array.from(t.querySelectorAll('tr.member')).map(
                            r => [r.cells[0].innerText, r.querySelector('td.state').innerText])])};
        """)
        assert [party for party, _ in page["parties"]] == ["dc0", "dc1"]
        assert {party: sorted(name for name, _ in rows) for party, rows in page["parties"]} == EVERYONE
        assert [state for _, rows in page["parties"] for _, state in rows] == ["training"] * 7
        assert "dist_sync" in page["job"] and SECRET not in page["html"]
        shot = tmp_path / "status.png"
        assert driver.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
        if os.environ.get("UPDATE_DOCS_SCREENSHOT") == "1":
            shutil.copyfile(shot, REPO_ROOT / "docs" / "images" / "status.png")
    finally:
        driver.quit()


@pytest.mark.slow
def test_the_job_ends_cleanly_and_the_page_with_it(running_job):
    url = running_job.url()
    result = running_job.stop()
    assert result.exit_code == 0, running_job.out.getvalue()[-3000:]
    with pytest.raises(OSError):  # the page stops with the scheduler
        fetch(url)


def test_geomx_status_names_an_address_nothing_answers_at(reserved_port):
    address = f"127.0.0.1:{reserved_port()}"  # held, never listening: refused at once
    shown = subprocess.run([sys.executable, "-m", "geomx.cli", "status", address, "--timeout", "5"],
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 2
    assert f"geomx status: cannot read the status of http://{address}/status.json" in shown.stderr


def test_geomx_status_names_an_address_that_is_not_host_port():
    shown = subprocess.run([sys.executable, "-m", "geomx.cli", "status", "localhost:notaport"],
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 2, shown.stderr  # http.client.InvalidURL, not a traceback
    assert "geomx status: cannot read the status of http://localhost:notaport/status.json" in shown.stderr
    assert "Traceback" not in shown.stderr
