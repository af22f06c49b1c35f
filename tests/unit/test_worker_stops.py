"""Who stopped the job, in parts: the servers' findings and the culprit they name (``geomx.runs.findings``), the
summary's status line, a server refusing the goodbye of a client that a round still needs (``PushPulls``), and the
worker's exit hook and one-line failures (``geomx.worker.exits``). The real jobs are in
``tests/integration/test_worker_stops.py``."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from geomx.core.rounds import RoundTable
from geomx.protocol.wire import Kind, Message
from geomx.runs.findings import LEFT, MISSING, culprit, read_findings, record_finding
from geomx.runs.summary import blame, summary_text
from geomx.server.pushpull import PushPulls
from geomx.transport.rpc import RemoteError, RequestTimeout
from geomx.worker import exits

HANG = [{"by": "global_server0", "what": MISSING, "kind": "PUSHPULL", "round": 3, "clients": ["dc0/server"],
         "waited_s": 20.0},
        {"by": "dc0/server", "what": MISSING, "kind": "PUSHPULL", "round": 3, "clients": ["dc0/worker1"],
         "waited_s": 20.0}]


def test_the_culprit_is_the_client_a_server_waited_for_that_waited_for_nobody() -> None:
    codes = {"dc1/worker0": 1, "dc0/worker1": -15}
    assert culprit(HANG, "dc1/worker0", codes) == ("dc0/worker1", "dc0/worker1 sent nothing for round 3 in 20 s")
    assert culprit([], "dc1/worker0", codes) == ("dc1/worker0", None)  # no finding: the first process that failed


def test_a_collective_party_is_named_as_the_party_and_the_first_failure_stays_the_process() -> None:
    party = [{"by": "global_server0", "what": MISSING, "kind": "PUSHPULL", "round": 3, "clients": ["dc1/ranks"],
              "waited_s": 10.0}]
    assert culprit(party, "dc1/worker0", {"dc1/worker0": 1}) == (
        "dc1/worker0", "dc1 (a lan: collective party) sent nothing for round 3 in 10 s")


def test_a_client_that_left_is_named_with_its_exit_code_where_it_exited_by_itself() -> None:
    left = [{"by": "dc0/server", "what": LEFT, "kind": "PUSHPULL", "round": 3, "clients": ["dc0/worker1"]}]
    assert culprit(left, "dc0/server", {"dc0/worker1": 3})[1] == \
        "dc0/worker1 exited with code 3 before its push of round 3, which the others waited for"
    assert culprit(left, "dc0/server", {"dc0/worker1": -15})[1].startswith("dc0/worker1 left the job before")


def test_findings_are_appended_and_read_back_since_a_time(tmp_path: Path) -> None:
    record_finding(tmp_path, "dc0/server", dict(HANG[1]))
    (tmp_path / "findings" / "dc0_server.jsonl").open("a").write('{"by": "dc0/ser')  # a process stopped mid-write
    found = read_findings(tmp_path)
    assert [f["clients"] for f in found] == [["dc0/worker1"]] and found[0]["by"] == "dc0/server"
    assert read_findings(tmp_path, since=found[0]["time"] + 1) == []
    record_finding(None, "dc0/server", dict(HANG[1]))  # no run folder: nothing written, no error


def test_the_summary_names_the_culprit_of_a_failed_job_only() -> None:
    summary: dict[str, Any] = {"findings": HANG}
    assert blame(summary, "dc1/worker0", {"dc1/worker0": 1, "dc0/worker1": -15}) == "dc0/worker1"
    assert "status        : FAILED (dc0/worker1 sent nothing for round 3 in 20 s)" in summary_text(1, "dc0/worker1",
                                                                                                 9.0, summary)
    assert blame({"findings": HANG}, None, {}) is None  # an ok or interrupted job names nobody


class Server:
    """A local server's state as ``PushPulls`` sees it, for clients w0 and w1 (the unit tests' fake host, plus the
    run folder, a clock, and what departures and pushes read)."""

    def __init__(self, make_server: Any, run_dir: Path) -> None:
        self.now = [0.0]
        self.host = make_server("dc0/server", ["w0", "w1"])
        host = self.host
        host.table = RoundTable(host, host.clients, host.table.policy, clock=lambda: self.now[0])
        host.is_global = False
        host.config = SimpleNamespace(run_dir=run_dir, topology=SimpleNamespace(elastic=False))
        host.aggregation = SimpleNamespace(may_drop=lambda usual: usual)
        host.route = SimpleNamespace(accepts_without_tensor=lambda message: False, pushed=lambda message: None)
        host.stored[(1, 0)] = host.stored[(0, 0)]
        self.pushpulls = PushPulls(host)

    def push(self, client: str, key: int = 0) -> None:
        self.pushpulls.on_pushpull(Message(Kind.PUSHPULL, key=key, slice=0, num_slices=1, sender=client.encode(),
                                           request_id=1, tensor=np.ones(4, dtype=np.float32),
                                           dtype=np.dtype(np.float32), shape=(4,)))

    def goodbye(self, client: str) -> None:
        self.pushpulls.on_shutdown(Message(Kind.SHUTDOWN, sender=client.encode(), request_id=9))


def test_a_goodbye_while_a_round_needs_the_client_is_refused_naming_it(make_server: Any, tmp_path: Path) -> None:
    server = Server(make_server, tmp_path)
    server.push("w0")
    server.goodbye("w1")
    assert server.host.refused == ["w1 is leaving before its part of PUSHPULL round 0 of key 0 slice 0, which the "
                                   "others wait for"]
    assert server.host.table.get(Kind.SHUTDOWN, 0, 0) is None  # it joined no shutdown round
    (finding,) = read_findings(tmp_path)
    assert (finding["what"], finding["by"], finding["clients"], finding["round"]) == (LEFT, "dc0/server", ["w1"], 0)


def test_a_goodbye_that_came_first_is_refused_when_a_round_needs_the_client(make_server: Any, tmp_path: Path) -> None:
    server = Server(make_server, tmp_path)
    server.goodbye("w1")  # nothing open: it joins the shutdown round as usual
    assert "w1" in server.host.table.get(Kind.SHUTDOWN, 0, 0).contributions and server.host.refused == []
    server.push("w0")
    (peer, answer), = server.host.sent
    assert peer == "w1" and answer.kind is Kind.ERROR and "w1 is leaving before its part of PUSHPULL round 0" in \
        answer.body["error"]
    assert [f["clients"] for f in read_findings(tmp_path)] == [["w1"]]


def test_goodbyes_at_the_end_of_training_make_the_usual_shutdown_round(make_server: Any, tmp_path: Path) -> None:
    server = Server(make_server, tmp_path)
    server.push("w1")  # its last push is in: the round needs w0 alone
    server.goodbye("w1")
    server.push("w0")  # the last round completes
    server.goodbye("w0")
    assert server.host.refused == [] and read_findings(tmp_path) == [] and server.host.sent == []
    assert [r.kind for r in server.host.completed] == [Kind.PUSHPULL, Kind.SHUTDOWN]


def test_a_round_that_times_out_is_noted_once_with_whom_it_waited_for(make_server: Any, tmp_path: Path) -> None:
    server = Server(make_server, tmp_path)
    server.push("w0", key=0)
    server.push("w0", key=1)
    server.now[0] = 10.0
    server.pushpulls.expire(20.0, 20.0)
    assert read_findings(tmp_path) == []  # not overdue yet
    server.now[0] = 21.0
    server.pushpulls.expire(20.0, 20.0)
    (finding,) = read_findings(tmp_path)  # both keys' rounds timed out: one finding
    assert (finding["what"], finding["clients"], finding["round"], finding["waited_s"]) == (MISSING, ["w1"], 0, 20.0)


def test_failures_from_elsewhere_print_one_line_other_errors_their_traceback(monkeypatch: pytest.MonkeyPatch,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[BaseException] = []
    monkeypatch.setattr(sys, "excepthook", lambda kind, error, trace: seen.append(error))
    exits.quiet_failures()
    exits.quiet_failures()  # a second kvstore: not wrapped twice
    timeout = RequestTimeout("timed out after 20 s waiting for dc0/server to answer PUSHPULL of key 0 slice 0")
    sys.excepthook(RequestTimeout, timeout, None)
    sys.excepthook(RemoteError, RemoteError("dc0/server refused the request: x"), None)
    bug = ValueError("a bug of the script's")
    sys.excepthook(ValueError, bug, None)
    assert capsys.readouterr().err.splitlines() == [f"geomx: stopped: {timeout}",
                                                    "geomx: stopped: dc0/server refused the request: x"]
    assert seen == [bug]  # the hook that was there prints it, traceback and all


def test_the_exit_hook_says_a_failed_goodbye_in_one_line(monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    calls: list[bool] = []

    def close(crashed: bool) -> None:
        calls.append(crashed)
        raise RemoteError("dc0/server refused the request: dc0/server: w1 is leaving before its part of ...")

    monkeypatch.delattr(sys, "last_value", raising=False)
    exits.LeaveAtExit(close, "dc0/worker1")()  # no exception escapes the hook
    monkeypatch.setattr(sys, "last_value", RuntimeError("boom"), raising=False)
    exits.LeaveAtExit(close, "dc0/worker1")()
    assert calls == [False, True]  # after an uncaught exception: just disconnect
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and lines[0].startswith("geomx: dc0/worker1 left the job without a clean shutdown: dc0/")
