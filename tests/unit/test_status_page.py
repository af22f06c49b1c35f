"""The status page's data, HTML and Prometheus text (geomx.cluster.status, geomx.cluster.status_page), without a job:
a board fed heartbeat reports by hand, on a fake clock, and the HTTP server on a free port of 127.0.0.1."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from geomx.cluster.status import MemberRow, StatusBoard, checkpoints
from geomx.cluster.status_page import StatusServer, render_html
from geomx.config import ConfigError, job_status, topology_from_dict, topology_to_dict
from geomx.protocol.bodies import BodyError, HeartbeatBody, decode_body, encode_body

SECRET = "s3cret-never-shown"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def topology(tmp_path: Path | None = None):
    raw = {"parties": {"dc0": 2, "dc1": {"workers": 2, "lan": "collective"}}, "global_servers": 2,
           "training": {"compression": "bsc:threshold=0.01"}, "security": {"secret": SECRET}}
    if tmp_path is not None:
        raw["checkpoint"] = {"dir": str(tmp_path / "ckpt"), "every_steps": 5}
    return topology_from_dict(raw)


ROWS = [MemberRow("gs0", "global_server0", "global_server", "dc0", 0, "training"),
        MemberRow("gs1", "global_server1", "global_server", "dc0", 1, "training"),
        MemberRow("ls0", "dc0/server", "local_server", "dc0", 0, "training"),
        MemberRow("r0", "dc1/worker0", "worker", "dc1", 0, "training"),
        MemberRow("r1", "dc1/worker1", "worker", "dc1", 1, "dead")]


def fed_board(clock: Clock, tmp_path: Path | None = None) -> StatusBoard:
    board = StatusBoard(topology(tmp_path), clock=clock)
    parties = {"gs0": "dc0", "gs1": "dc0", "ls0": "dc0", "r0": "dc1", "r1": "dc1"}
    for member, party in parties.items():
        board.seen(member, party)
    board.heard("gs0", HeartbeatBody(wan_sent=1000, wan_recv=2000, step=7))
    board.heard("gs1", HeartbeatBody(wan_sent=500, wan_recv=500, step=5))
    board.heard("ls0", HeartbeatBody(lan_sent=300, lan_recv=400, step=6))
    board.heard("r0", HeartbeatBody(wan_sent=100, wan_recv=50, step=9, busy=0.75))
    board.heard("r1", HeartbeatBody(wan_sent=10, wan_recv=5, step=3))
    clock.now += 2.0
    board.heard("r0", HeartbeatBody(wan_sent=100 + 2000, wan_recv=50 + 1000, step=11, busy=0.5))  # 1000 B/s out
    clock.now += 0.5
    return board


def test_the_snapshot_holds_every_party_member_state_and_traffic_and_no_secret():
    data = fed_board(Clock()).snapshot(ROWS, {}, "training")
    assert data["job"]["algorithm"] == "dist_sync" and data["job"]["codec"] == "bsc"
    assert data["job"]["global_round"] == 5  # the least advanced global server
    dc0, dc1 = data["parties"]
    assert [m["name"] for m in dc0["members"]] == ["global_server0", "global_server1", "dc0/server"]
    assert [(m["name"], m["state"]) for m in dc1["members"]] == [("dc1/worker0", "training"),
                                                                   ("dc1/worker1", "dead")]
    assert dc0["wan_bytes"] == {"sent": 1500, "recv": 2500} and dc0["lan_bytes"] == {"sent": 300, "recv": 400}
    # a dead member's last counts still count for its party; the rate comes from r0's last two heartbeats
    assert dc1["wan_bytes"] == {"sent": 2110, "recv": 1055}
    assert dc1["wan_rate_bps"] == {"sent": 8000.0, "recv": 4000.0}
    assert dc1["step"] == 11 and dc0["step"] == 6  # a dead member holds no party back; servers' rounds apart
    worker = dc1["members"][0]
    assert worker["heartbeat_age_s"] == 0.5 and worker["busy"] == 0.5
    assert SECRET not in json.dumps(data)


def test_a_member_never_heard_has_its_age_from_registration_and_no_counts():
    clock = Clock()
    board = StatusBoard(topology(), clock=clock)
    board.seen("ls0", "dc0")
    clock.now += 3.0
    data = board.snapshot([MemberRow("ls0", "dc0/local_server", "local_server", "dc0", None, "waiting")],
                          {"worker@dc1": 2}, "registering")
    member = data["parties"][0]["members"][0]
    assert member["heartbeat_age_s"] == 3.0 and member["step"] is None and member["wan_bytes"]["sent"] == 0
    assert data["missing"] == {"worker@dc1": 2} and data["job"]["phase"] == "registering"


def test_checkpoints_are_read_from_the_manifests_names_per_shard(tmp_path):
    folder = tmp_path / "ckpt"
    assert checkpoints(None, 2) is None
    assert checkpoints(folder, 2) == {"dir": str(folder), "shards": [], "step": None, "age_s": None}
    for shard, steps in ((0, (10, 20)), (1, (10,))):
        (folder / f"gs{shard}").mkdir(parents=True)
        for step in steps:
            manifest = folder / f"gs{shard}" / f"ckpt-{step:09d}.json"
            manifest.write_text("{}")
            os.utime(manifest, (1000.0 + step, 1000.0 + step))
    (folder / "gs0" / "ckpt-000000030.json.tmp").write_text("{}")  # a write in progress is not a checkpoint
    found = checkpoints(folder, 2, now=1100.0)
    assert found["shards"] == [{"shard": 0, "step": 20, "age_s": 80.0}, {"shard": 1, "step": 10, "age_s": 90.0}]
    assert found["step"] == 10 and found["age_s"] == 90.0  # a resume starts every shard: the least advanced counts


def test_the_page_shows_every_party_and_member_and_escapes_names():
    data = fed_board(Clock()).snapshot(ROWS, {}, "training")
    data["parties"][1]["members"][0]["name"] = "<script>x</script>"
    page = render_html(data)
    assert "http-equiv='refresh'" in page and "id='party-dc0'" in page and "id='party-dc1'" in page
    assert page.count("<tr class='member") == len(ROWS)
    assert "<script>x" not in page and "&lt;script&gt;" in page
    assert "bsc" in page and "8.00 kbit/s" in page and SECRET not in page


def scrape(url: str) -> tuple[str, str]:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return answer.headers["Content-Type"], answer.read().decode()


def test_the_server_serves_the_page_the_json_and_prometheus_text(tmp_path):
    clock = Clock()
    board = fed_board(clock, tmp_path)
    shard = tmp_path / "ckpt" / "gs0"
    shard.mkdir(parents=True)
    (shard / "ckpt-000000015.json").write_text("{}")
    page = StatusServer("127.0.0.1", 0, lambda: board.snapshot(ROWS, {}, "training")).start()
    url = page.url
    try:
        assert page.url.startswith("http://127.0.0.1:") and not page.url.endswith(":0/")
        kind, text = scrape(page.url)
        assert kind.startswith("text/html") and "dc1/worker1" in text
        kind, text = scrape(page.url + "status.json")
        assert kind == "application/json" and json.loads(text)["parties"][1]["name"] == "dc1"
        kind, text = scrape(page.url + "metrics")
        assert kind.startswith("text/plain") and SECRET not in text
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for family in text_string_to_metric_families(text) for s in family.samples}
        assert samples[("geomx_wan_bytes_total", (("direction", "sent"), ("party", "dc1")))] == 2110
        assert samples[("geomx_lan_bytes_total", (("direction", "recv"), ("party", "dc0")))] == 400
        assert samples[("geomx_heartbeat_age_seconds", (("party", "dc1"), ("rank", "0"), ("role", "worker")))] == 0.5
        assert samples[("geomx_member_state", (("party", "dc1"), ("rank", "1"), ("role", "worker"),
                                               ("state", "dead")))] == 1
        assert samples[("geomx_steps_total", (("party", "dc1"), ("rank", "0"), ("role", "worker")))] == 11
        assert samples[("geomx_busy_ratio", (("party", "dc1"), ("rank", "0"), ("role", "worker")))] == 0.5
        assert samples[("geomx_global_rounds_total", ())] == 5
        assert samples[("geomx_checkpoint_step", (("rank", "0"), ("role", "global_server")))] == 15
        assert samples[("geomx_wan_rate_bytes_per_second", (("direction", "sent"), ("party", "dc1")))] == 1000
        with pytest.raises(urllib.error.HTTPError, match="404"):
            scrape(page.url + "nothing")
    finally:
        page.stop()
    with pytest.raises(urllib.error.URLError):  # stopped: the port no longer answers
        scrape(url)


def test_two_servers_never_share_metrics():
    """Each server has its own registry (no global state): two boards, two sets of numbers."""
    first = StatusServer("127.0.0.1", 0, lambda: fed_board(Clock()).snapshot(ROWS, {}, "training"))
    second = StatusServer("127.0.0.1", 0, lambda: StatusBoard(topology()).snapshot([], {}, "registering"))
    assert first.registry is not second.registry
    from prometheus_client import generate_latest

    assert b'geomx_wan_bytes_total{direction="sent",party="dc1"} 2110.0' in generate_latest(first.registry)
    assert b'party="dc1"} 2110.0' not in generate_latest(second.registry)


def test_a_heartbeat_report_round_trips_and_a_bad_one_is_named():
    body = HeartbeatBody(lan_sent=1, wan_recv=2, step=3, busy=0.5)
    assert decode_body(HeartbeatBody, encode_body(body)) == body
    assert decode_body(HeartbeatBody, {}) == HeartbeatBody()  # a plain heartbeat
    with pytest.raises(BodyError, match=r"HeartbeatBody\.step"):
        decode_body(HeartbeatBody, {"step": "many"})


def test_the_status_block_and_its_variables():
    base = {"parties": {"dc0": 1}}
    assert topology_from_dict(base).status.enabled and topology_from_dict(base).status.port == 0
    assert not topology_from_dict({**base, "status": False}).status.enabled
    spec = topology_from_dict({**base, "status": {"host": "0.0.0.0", "port": 9100}}).status
    assert (spec.host, spec.port) == ("0.0.0.0", 9100)
    assert topology_from_dict(topology_to_dict(topology_from_dict({**base, "status": {"port": 9100}}))).status.port \
        == 9100
    assert job_status(topology_from_dict(base), {"GEOMX_STATUS_PORT": "9200"}).port == 9200
    assert not job_status(topology_from_dict(base), {"GEOMX_STATUS": "0"}).enabled
    with pytest.raises(ConfigError, match="status has unknown fields"):
        topology_from_dict({**base, "status": {"prot": 1}})
    with pytest.raises(ConfigError, match=r"status.port must be 0..65535"):
        topology_from_dict({**base, "status": {"port": 70000}})
    with pytest.raises(ConfigError, match="GEOMX_STATUS_PORT must be an integer"):
        job_status(topology_from_dict(base), {"GEOMX_STATUS_PORT": "eighty"})


def test_the_launcher_holds_the_page_port_and_names_one_in_use(tmp_path, monkeypatch):
    import socket

    from geomx.launch import PortReservations, plan_processes, reserve_status_page

    monkeypatch.delenv("GEOMX_STATUS_PORT", raising=False)
    monkeypatch.delenv("GEOMX_STATUS", raising=False)
    job = topology_from_dict({"parties": {"dc0": 1, "dc1": 1}})
    with PortReservations("127.0.0.1") as ports:
        specs = plan_processes(job, tmp_path / "t.yaml", ["python", "x.py"], tmp_path, ports=ports)
        url = reserve_status_page(job, specs, "127.0.0.1", ports)
        scheduler = next(s for s in specs if s.label == "global_scheduler")
        assert url == f"http://127.0.0.1:{scheduler.env['GEOMX_STATUS_PORT']}/"
        # a party launched on its own host runs no global scheduler: no page here
        party = plan_processes(job, tmp_path / "t.yaml", ["python", "x.py"], tmp_path, ports=ports, parties=["dc1"],
                               global_scheduler="127.0.0.1:1")
        assert reserve_status_page(job, party, "127.0.0.1", ports) is None
        off = topology_from_dict({"parties": {"dc0": 1}, "status": False})
        assert reserve_status_page(off, specs, "127.0.0.1", ports) is None
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = topology_from_dict({"parties": {"dc0": 1}, "status": {"port": taken.getsockname()[1]}})
        with PortReservations("127.0.0.1") as ports:
            specs = plan_processes(busy, tmp_path / "t.yaml", ["python", "x.py"], tmp_path, ports=ports)
            with pytest.raises(ConfigError, match=rf"status.port {taken.getsockname()[1]} \(GEOMX_STATUS_PORT\) "
                                                  "cannot be bound at 127.0.0.1: Address already in use"):
                reserve_status_page(busy, specs, "127.0.0.1", ports)


def test_a_party_schedulers_view_of_its_workers_is_relayed_to_the_page():
    """Workers beat to their party's scheduler alone: its board's records travel in the local server's heartbeats."""
    clock = Clock()
    party_board = StatusBoard(topology(), clock=clock)
    workers = [MemberRow("w0", "dc0/worker0", "worker", "dc0", 0, "training"),
               MemberRow("w1", "dc0/worker1", "worker", "dc0", 1, "dead")]
    for row in workers:
        party_board.seen(row.id, "dc0")
    party_board.heard("w0", HeartbeatBody(lan_sent=70, step=40, busy=0.9))
    party_board.heard("w1", HeartbeatBody(lan_sent=60, step=12))
    clock.now += 1.0
    relay = party_board.members(workers)
    assert set(relay) == {"dc0/worker0", "dc0/worker1"} and relay["dc0/worker0"]["heartbeat_age_s"] == 1.0
    relay["bogus"] = {"state": "asleep", "role": "worker"}  # not a state: left out, not shown half-read

    page_board = StatusBoard(topology(), clock=clock)
    page_board.seen("ls0", "dc0")
    page_board.heard("ls0", HeartbeatBody(lan_sent=500, lan_recv=600, step=30,
                                          party=decode_body(HeartbeatBody, {"party": relay}).party))
    clock.now += 0.5
    dc0 = page_board.snapshot([MemberRow("ls0", "dc0/server", "local_server", "dc0", 0, "training")], {},
                              "training")["parties"][0]
    shown = {m["name"]: m for m in dc0["members"]}
    assert list(shown) == ["dc0/server", "dc0/worker0", "dc0/worker1"]
    assert shown["dc0/worker0"]["heartbeat_age_s"] == 1.5  # its scheduler's age, plus the relay's own
    assert (shown["dc0/worker0"]["step"], shown["dc0/worker0"]["busy"], shown["dc0/worker1"]["state"]) == \
        (40, 0.9, "dead")
    assert dc0["step"] == 40  # the live workers' step (the wrapper's) over the server's rounds
    assert dc0["lan_bytes"] == {"sent": 500, "recv": 600}  # the workers' bytes are the server's: counted once


def test_the_round_durations_become_a_prometheus_histogram():
    from prometheus_client import generate_latest

    from geomx.protocol.bodies import ROUND_BUCKETS_S

    clock = Clock()
    board = StatusBoard(topology(), clock=clock)
    board.seen("gs0", "dc0")
    counts = [0] * (len(ROUND_BUCKETS_S) + 1)
    counts[ROUND_BUCKETS_S.index(0.01)], counts[ROUND_BUCKETS_S.index(0.1)], counts[-1] = 3, 1, 1
    board.heard("gs0", HeartbeatBody(step=5, round_counts=counts, round_seconds=40.06))
    rows = [MemberRow("gs0", "global_server0", "global_server", "dc0", 0, "training")]
    page = StatusServer("127.0.0.1", 0, lambda: board.snapshot(rows, {}, "training"))
    found = {(s.name, s.labels.get("le")): s.value
             for family in text_string_to_metric_families(generate_latest(page.registry).decode())
             if family.name == "geomx_round_duration_seconds" for s in family.samples}
    assert found[("geomx_round_duration_seconds_bucket", "0.005")] == 0
    assert found[("geomx_round_duration_seconds_bucket", "0.01")] == 3  # cumulative, as Prometheus counts
    assert found[("geomx_round_duration_seconds_bucket", "0.1")] == 4
    assert found[("geomx_round_duration_seconds_bucket", "30")] == 4
    assert found[("geomx_round_duration_seconds_bucket", "+Inf")] == 5
    assert found[("geomx_round_duration_seconds_count", None)] == 5
    assert found[("geomx_round_duration_seconds_sum", None)] == pytest.approx(40.06)
    assert "8012.0 ms" in render_html(board.snapshot(rows, {}, "training"))  # the page's mean round
    with pytest.raises(BodyError, match=r"HeartbeatBody\.round_counts\[1\]: expected int"):
        decode_body(HeartbeatBody, {"round_counts": [1, "x"]})


def test_ssp_staleness_from_the_global_servers_answers():
    """Each global server reports how far ahead of its round each answer let a client run; the page sums them."""
    clock = Clock()
    board = StatusBoard(topology(), clock=clock)
    for member, party in (("gs0", "dc0"), ("gs1", "dc0"), ("ls1", "dc1")):
        board.seen(member, party)
    board.heard("gs0", HeartbeatBody(leads={"dc1/server": {"0": 4, "2": 3}}))
    board.heard("gs1", HeartbeatBody(leads={"dc1/server": {"0": 2, "2": 1}, "gone": {"0": 9}}))
    rows = [MemberRow("gs0", "global_server0", "global_server", "dc0", 0, "training"),
            MemberRow("gs1", "global_server1", "global_server", "dc0", 1, "training"),
            MemberRow("ls1", "dc1/server", "local_server", "dc1", 0, "training")]
    data = board.snapshot(rows, {}, "training")
    dc0, dc1 = data["parties"]
    assert dc1["members"][0]["answers_ahead"] == {"0": 6, "2": 4} == dc1["answers_ahead"]
    assert dc0["answers_ahead"] is None  # the global servers are answered by nobody
    assert "answers ahead of their round: mean 0.80, max 2" in render_html(data)
    page = StatusServer("127.0.0.1", 0, lambda: board.snapshot(rows, {}, "training"))
    from prometheus_client import generate_latest

    found = {(s.name, s.labels.get("le")): s.value
             for family in text_string_to_metric_families(generate_latest(page.registry).decode())
             if family.name == "geomx_staleness_rounds" for s in family.samples}
    assert (found[("geomx_staleness_rounds_bucket", "0")], found[("geomx_staleness_rounds_bucket", "1")],
            found[("geomx_staleness_rounds_bucket", "2")], found[("geomx_staleness_rounds_bucket", "+Inf")]) == \
        (6, 6, 10, 10)
    assert found[("geomx_staleness_rounds_sum", None)] == 8


def test_a_pulse_reports_its_counters_and_notes_and_relays_its_partys_members_upward_only():
    """What a node's heartbeats carry: its van's byte counters, the step and busy share noted (busy kept in 0..1),
    and a local server's relay of its party's members to every scheduler but the one that sent it."""
    from geomx.cluster.heartbeat import Pulse
    from geomx.config import Timeouts
    from geomx.protocol.wire import Kind, Message
    from geomx.transport.counters import LAN, WAN, ByteCounters

    class FakeVan:
        name, identity = "dc1/server", "dc1/server/1"

        def __init__(self) -> None:
            self.counters = ByteCounters()
            self.sent: list[tuple[str, Message]] = []

        def send(self, peer: str, message: Message) -> None:
            self.sent.append((peer, message))

    van = FakeVan()
    van.counters.add("gs", WAN, "sent", 700)
    van.counters.add("w0", LAN, "recv", 300)
    slow = Timeouts(heartbeat_s=120.0, heartbeat_interval_s=60.0)  # no beat of its own during the test
    pulse = Pulse(van, requests=None, timeouts=slow)  # type: ignore[arg-type]
    try:
        pulse.watch("dc1/scheduler")
        pulse.watch("global_scheduler")
        pulse.note(step=12, busy=1.7)
        relay = {"dc1/worker0": {"role": "worker", "state": "training", "step": 9}}
        answer = Message(Kind.HEARTBEAT, body={"dead": {}, "party": relay}).reply(body={"dead": {}, "party": relay})
        answer.sender = b"dc1/scheduler"
        assert pulse(answer)
        up, back = pulse.report("global_scheduler"), pulse.report("dc1/scheduler")
        assert (up.wan_sent, up.lan_recv, up.step, up.busy) == (700, 300, 12, 1.0)
        assert up.party == relay and back.party is None
        beats = [decode_body(HeartbeatBody, m.body) for _, m in van.sent if m.kind is Kind.HEARTBEAT]
        assert beats and all(b.wan_sent == 700 for b in beats)  # every heartbeat carries the report
    finally:
        pulse.stop()


def test_what_the_codecs_saved_per_link_class_reaches_the_metrics_and_the_page():
    from prometheus_client import generate_latest

    from geomx.protocol.wire import Kind, Message
    from geomx.transport.counters import LAN, WAN, ByteCounters, codec_saving

    dense = np.zeros(1000, dtype=np.float32)
    half = Message(Kind.PUSHPULL, codec=1, encoded=[dense.astype(np.float16)], dtype=dense.dtype, shape=dense.shape)
    assert codec_saving(half) == 2000 and codec_saving(Message(Kind.PUSHPULL, tensor=dense)) is None
    counters = ByteCounters()
    counters.add_saved(WAN, 3000)
    counters.add_saved(WAN, -50)  # a codec that made a message larger saves nothing, and takes nothing back
    counters.add_saved(LAN, 7)
    assert counters.saved_bytes() == {"lan": 7, "wan": 3000}
    clock = Clock()
    board = StatusBoard(topology(), clock=clock)
    for member in ("ls0", "gs0"):
        board.seen(member, "dc0")
    # a worker's LAN savings beat to its party's scheduler: its local server relays them here
    relay = {"dc0/worker0": {"role": "worker", "state": "training", "saved_bytes": {"lan": 2000, "wan": 0}}}
    board.heard("ls0", HeartbeatBody(wan_saved=3000, lan_saved=7, party=relay))
    board.heard("gs0", HeartbeatBody(wan_saved=1000))
    rows = [MemberRow("ls0", "dc0/server", "local_server", "dc0", 0, "training")]
    data = board.snapshot(rows, {}, "training")
    assert data["parties"][0]["codec_saved_bytes"] == {"wan": 4000, "lan": 2007}
    assert "the codecs saved 4.00 kB of WAN and 2.01 kB of LAN" in render_html(data)
    text = generate_latest(StatusServer("127.0.0.1", 0, lambda: data).registry).decode()
    assert 'geomx_wan_codec_saved_bytes_total{party="dc0"} 4000.0' in text
    assert 'geomx_lan_codec_saved_bytes_total{party="dc0"} 2007.0' in text
    assert 'geomx_wan_codec_saved_bytes_total{party="dc1"} 0.0' in text
