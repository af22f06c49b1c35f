"""Decoupled rounds' status: a global server's counts per party travel with its heartbeats to the status page's
members and to ``/metrics`` (``geomx_outer_rounds_total``)."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from geomx.algorithms.hfa.quorum import Decoupled, QuorumRounds
from geomx.cluster.status import MemberRow, StatusBoard
from geomx.cluster.status_page import StatusServer
from geomx.config import topology_from_dict
from geomx.core.rounds import Admission, Round
from geomx.protocol.bodies import HeartbeatBody, decode_body, encode_body
from geomx.protocol.wire import Kind

ROWS = [MemberRow("gs0", "global_server0", "global_server", "dc0", 0, "training"),
        MemberRow("ls0", "dc0/server", "local_server", "dc0", 0, "training"),
        MemberRow("ls1", "dc1/server", "local_server", "dc1", 0, "training")]


def test_the_rules_counts_per_party_reach_the_members_and_the_metrics() -> None:
    rule = QuorumRounds(Decoupled(quorum=1, grace=0.0, stale_rounds=0))
    rnd = Round(Kind.PUSHPULL, 0, 0)
    rnd.contributions["ls0"] = None  # type: ignore[assignment]
    rnd.arrivals["ls0"] = 0.0
    rule.closed(rnd, {"ls0", "ls1"})
    rnd.number = 1
    assert rule.admit(rnd, "ls1", 1.0) is Admission.DROPPED  # one round late, beyond stale_rounds 0
    names = {"ls0": "dc0/server", "ls1": "dc1/server"}
    by_party = rule.report(names.__getitem__)["by_party"]
    assert by_party == {"dc0/server": {"on_time": 1, "missed": 0, "lost": 0, "late_folded": 0, "dropped": 0},
                        "dc1/server": {"on_time": 0, "missed": 1, "lost": 0, "late_folded": 0, "dropped": 1}}
    body = decode_body(HeartbeatBody, encode_body(HeartbeatBody(outer_rounds=by_party)))  # as the wire carries it
    board = StatusBoard(topology_from_dict({"parties": {"dc0": 1, "dc1": 1}}))
    for row in ROWS:
        board.seen(row.id, row.party)
    board.heard("gs0", body)
    data = board.snapshot(ROWS, {}, "training")
    dc1 = next(p for p in data["parties"] if p["name"] == "dc1")
    assert dc1["members"][0]["outer_rounds"] == by_party["dc1/server"]
    page = StatusServer("127.0.0.1", 0, lambda: board.snapshot(ROWS, {}, "training"))
    found = {(s.labels["party"], s.labels["status"]): s.value
             for f in text_string_to_metric_families(generate_latest(page.registry).decode())
             if f.name == "geomx_outer_rounds" for s in f.samples}
    assert found[("dc1", "missed")] == 1 and found[("dc1", "dropped")] == 1 and found[("dc0", "on_time")] == 1


def test_a_collective_partys_counts_are_the_partys_on_the_page_the_text_and_the_metrics() -> None:
    """A collective party's ranks are one client, ``dc1/ranks``, which no member row is named after: its decoupled
    rounds show on its party (``outer_rounds``), in the page's and the terminal's party line, and in
    ``geomx_party_outer_rounds``; a server party's show there too, summed over its clients."""
    from geomx.cluster.status_page import render_html, render_text

    counts = {"dc0/server": {"on_time": 3, "missed": 0, "lost": 0, "late_folded": 0, "dropped": 0},
              "dc1/ranks": {"on_time": 1, "missed": 2, "lost": 0, "late_folded": 2, "dropped": 1}}
    rows = [ROWS[0], ROWS[1], MemberRow("w1", "dc1/worker0", "worker", "dc1", 0, "training"),
            MemberRow("w2", "dc1/worker1", "worker", "dc1", 1, "training")]
    board = StatusBoard(topology_from_dict({"parties": {"dc0": 1, "dc1": {"workers": 2, "lan": "collective"}}}))
    for row in rows:
        board.seen(row.id, row.party)
    board.heard("gs0", decode_body(HeartbeatBody, encode_body(HeartbeatBody(outer_rounds=counts))))
    data = board.snapshot(rows, {}, "training")
    parties = {p["name"]: p for p in data["parties"]}
    assert parties["dc1"]["outer_rounds"] == counts["dc1/ranks"]
    assert parties["dc0"]["outer_rounds"] == counts["dc0/server"]
    assert all(m["outer_rounds"] is None for m in parties["dc1"]["members"])  # no rank is the client
    line = "outer rounds: 1 on time, 2 missed, 0 lost, 2 folded in late, 1 dropped"
    assert line in render_html(data) and line in render_text(data)
    page = StatusServer("127.0.0.1", 0, lambda: board.snapshot(rows, {}, "training"))
    found = {(s.labels["party"], s.labels["status"]): s.value
             for f in text_string_to_metric_families(generate_latest(page.registry).decode())
             if f.name == "geomx_party_outer_rounds" for s in f.samples}
    assert found[("dc1", "late_folded")] == 2 and found[("dc1", "dropped")] == 1 and found[("dc0", "on_time")] == 3
