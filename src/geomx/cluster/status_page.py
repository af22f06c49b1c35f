"""The global scheduler's HTTP face: ``/`` (a page that refreshes itself), ``/status.json`` and ``/metrics``.

All three are rendered from one snapshot (``geomx.cluster.status.StatusBoard.snapshot``), asked for on the HTTP
server's own threads (the standard library's ``ThreadingHTTPServer``, daemon threads): a slow or stuck client
never holds up the scheduler. ``/metrics`` is Prometheus text made by ``prometheus_client`` from a registry of
this server's own (no global registry): names ``geomx_<noun>_<unit>`` with labels ``party``, ``rank``, ``role``,
``direction`` (the reference: docs/deployment.md, "Operating a job").

Usage::

    page = StatusServer("127.0.0.1", 0, snapshot=lambda: board.snapshot(rows, {}, "training")).start()
    print(page.url)        # http://127.0.0.1:PORT/
    page.stop()
"""

from __future__ import annotations

import html
import itertools
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import IO, Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

log = logging.getLogger("geomx.cluster.status")

Snapshot = Callable[[], dict[str, Any]]
REFRESH_S = 2  # the page reloads itself this often
STALENESS_BUCKETS = (0, 1, 2, 4, 8, 16)  # rounds ahead: the staleness histogram's bounds
PUSH_STALENESS_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64)  # updates missed: the push staleness histogram's bounds
_MEMBER = ("party", "rank", "role")


class JobCollector:
    """A prometheus_client collector: the snapshot's numbers as metric families, read at every scrape."""

    def __init__(self, snapshot: Snapshot) -> None:
        self._snapshot = snapshot

    def describe(self) -> list[Metric]:
        return []  # collected only on a scrape: registering must not ask for a snapshot

    def collect(self) -> Iterator[Metric]:
        data = self._snapshot()
        yield from _traffic(data)
        yield from _members(data)
        yield from _job(data)


def _traffic(data: dict[str, Any]) -> Iterator[Metric]:
    for link in ("wan", "lan"):
        family = CounterMetricFamily(f"geomx_{link}_bytes", f"bytes over the {link.upper()} counted by each party's "
                                     "members since they started (sent, recv)", labels=["party", "direction"])
        for party in data["parties"]:
            for direction, value in party[f"{link}_bytes"].items():
                family.add_metric([party["name"], direction], value)
        yield family
    for link in ("wan", "lan"):
        saved = CounterMetricFamily(f"geomx_{link}_codec_saved_bytes", f"bytes the codecs kept off the party's "
                                    f"{link.upper()} links (an encoded message's dense size less its frames)",
                                    labels=["party"])
        for party in data["parties"]:
            saved.add_metric([party["name"]], party["codec_saved_bytes"].get(link, 0))
        yield saved
    rate = GaugeMetricFamily("geomx_wan_rate_bytes_per_second", "a party's WAN rate over its members' last two "
                             "heartbeats", labels=["party", "direction"])
    for party in data["parties"]:
        for direction, bits in party["wan_rate_bps"].items():
            rate.add_metric([party["name"], direction], bits / 8)
    yield rate
    outer = CounterMetricFamily("geomx_party_outer_rounds", "the global servers' decoupled rounds for this party, "
                                "by status: on_time, missed, lost, late_folded, dropped", labels=["party", "status"])
    for party in data["parties"]:
        for status, count in sorted((party.get("outer_rounds") or {}).items()):
            outer.add_metric([party["name"], status], count)
    yield outer


def _members(data: dict[str, Any]) -> Iterator[Metric]:
    age = GaugeMetricFamily("geomx_heartbeat_age_seconds", "seconds since the member's last heartbeat",
                            labels=list(_MEMBER))
    state = GaugeMetricFamily("geomx_member_state", "1 for the member's state: waiting, training, rejoining, "
                              "left or dead", labels=[*_MEMBER, "state"])
    steps = CounterMetricFamily("geomx_steps", "a worker's training steps; a server's completed rounds (its least "
                                "advanced slice)", labels=list(_MEMBER))
    busy = GaugeMetricFamily("geomx_busy_ratio", "a worker's share of wall time computing, not waiting for the "
                             "network", labels=list(_MEMBER))
    rounds = HistogramMetricFamily("geomx_round_duration_seconds", "a server's rounds (one per slice), from the "
                                   "first contribution to the answers", labels=list(_MEMBER))
    stale = HistogramMetricFamily("geomx_staleness_rounds", "the global servers' answers to this client, by how "
                                  "many rounds ahead of its round each let it run (above 0 only under SSP)",
                                  labels=list(_MEMBER))
    pushes = HistogramMetricFamily("geomx_push_staleness_updates", "the global servers' pushes from this client, by "
                                   "how many updates of their slice were applied since its last answer for it "
                                   "(counted under MixedSync)", labels=list(_MEMBER))
    outer = CounterMetricFamily("geomx_outer_rounds", "the global servers' decoupled rounds for this client, by "
                                "status: on_time, missed, late_folded, dropped", labels=[*_MEMBER, "status"])
    model = GaugeMetricFamily("geomx_model_digest_step", "the step of a worker's newest model digest (where every "
                              "party should hold the same model then)", labels=list(_MEMBER))
    for party in data["parties"]:
        for member in party["members"]:
            labels = [member["party"], str(member["rank"] if member["rank"] is not None else ""), member["role"]]
            if member["heartbeat_age_s"] is not None:
                age.add_metric(labels, member["heartbeat_age_s"])
            state.add_metric([*labels, member["state"]], 1)
            if member["step"] is not None:
                steps.add_metric(labels, member["step"])
            if member["busy"] is not None:
                busy.add_metric(labels, member["busy"])
            times = member.get("rounds")
            if times:
                bounds = [*(f"{le:g}" for le in times["le"]), "+Inf"]
                rounds.add_metric(labels, list(zip(bounds, itertools.accumulate(times["counts"]), strict=True)),
                                  times["seconds"])
            for family, field, bounds in ((stale, "answers_ahead", STALENESS_BUCKETS),
                                          (pushes, "push_staleness", PUSH_STALENESS_BUCKETS)):
                found = member.get(field)
                if found:
                    counts = {int(k): v for k, v in found.items()}
                    buckets = [(f"{le}", sum(v for k, v in counts.items() if k <= le)) for le in bounds]
                    family.add_metric(labels, [*buckets, ("+Inf", sum(counts.values()))],
                                      sum(k * v for k, v in counts.items()))
            if member.get("model"):
                model.add_metric(labels, member["model"]["step"])
            for status, count in sorted((member.get("outer_rounds") or {}).items()):
                outer.add_metric([*labels, status], count)
    yield from (age, state, steps, busy, rounds, stale, pushes, outer, model)


def _job(data: dict[str, Any]) -> Iterator[Metric]:
    job = data["job"]
    uptime = GaugeMetricFamily("geomx_uptime_seconds", "seconds since the global scheduler started")
    uptime.add_metric([], job["uptime_s"])
    yield uptime
    if job["global_round"] is not None:
        rounds = CounterMetricFamily("geomx_global_rounds", "completed global rounds of the least advanced "
                                     "global server")
        rounds.add_metric([], job["global_round"])
        yield rounds
    disagreements = CounterMetricFamily("geomx_model_disagreements", "steps at which the workers' model digests "
                                        "differed (where every party should hold the same model)")
    disagreements.add_metric([], job["model"]["disagreements"])
    yield disagreements
    checkpoint = data["checkpoint"]
    if checkpoint and checkpoint["shards"]:
        step = GaugeMetricFamily("geomx_checkpoint_step", "step of each global server's newest checkpoint",
                                 labels=["rank", "role"])
        age = GaugeMetricFamily("geomx_checkpoint_age_seconds", "seconds since each global server's newest "
                                "checkpoint was written", labels=["rank", "role"])
        for shard in checkpoint["shards"]:
            step.add_metric([str(shard["shard"]), "global_server"], shard["step"])
            age.add_metric([str(shard["shard"]), "global_server"], shard["age_s"])
        yield from (step, age)


def _bytes(count: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= scale:
            return f"{count / scale:.2f} {unit}"
    return f"{count} B"


def _rate(bps: float) -> str:
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bps >= scale:
            return f"{bps / scale:.2f} {unit}"
    return f"{bps:.0f} bit/s"


def _saved(party: dict[str, Any]) -> str:
    """``; the codecs saved ...`` for a party whose codecs kept bytes off its links, else nothing."""
    saved = party["codec_saved_bytes"]
    links = [f"{_bytes(saved[link])} of {link.upper()}" for link in ("wan", "lan") if saved.get(link)]
    return f"; the codecs saved {' and '.join(links)}" if links else ""


def _staleness(party: dict[str, Any]) -> str:
    """``; answers ahead ...`` for a party some of whose answers came before their round (SSP), and ``; pushes
    stale by ...`` for one whose pushes were counted by staleness (MixedSync), else nothing."""
    shown = ""
    for field, what, always in (("answers_ahead", "answers ahead of their round", False),
                                ("push_staleness", "pushes stale by", True)):
        counts = {int(k): v for k, v in (party.get(field) or {}).items()}
        if counts and (always or any(k > 0 for k in counts)):
            mean = sum(k * v for k, v in counts.items()) / sum(counts.values())
            shown += f"; {what}: mean {mean:.2f}, max {max(counts)}" + (" updates" if always else "")
    return shown


def _outer(party: dict[str, Any]) -> str:
    """``; outer rounds: ...`` for a party of a job with decoupled rounds, else nothing."""
    counts = party.get("outer_rounds")
    if not counts:
        return ""
    words = (("on_time", "on time"), ("missed", "missed"), ("lost", "lost"), ("late_folded", "folded in late"),
             ("dropped", "dropped"))
    return "; outer rounds: " + ", ".join(f"{counts.get(key, 0)} {word}" for key, word in words)


def _model(job: dict[str, Any]) -> str | None:
    """The parties' model digests at their newest common step, and whether they agree (None: none reported)."""
    model = job["model"]
    if model["step"] is None:
        return None
    digests = ", ".join(f"{party} {' / '.join(d[:12] for d in found)}" for party, found in model["parties"].items())
    verdict = "the same everywhere" if model["agree"] else "DISAGREE"
    return f"model at step {model['step']}: {digests} ({verdict}; {model['disagreements']} steps disagreed)"


def _mean_round(member: dict[str, Any]) -> str | None:
    """A server's mean round duration so far, in ms (None for a member without rounds)."""
    times = member.get("rounds")
    return f"{1000 * times['seconds'] / times['count']:.1f} ms" if times and times["count"] else None


def _cell(value: Any) -> str:
    return "—" if value is None else html.escape(str(value))


def render_html(data: dict[str, Any]) -> str:
    """The page: the job, then one table per party (its members, their state, step and heartbeat age)."""
    job = data["job"]
    facts = ", ".join(f"{k}: {_cell(job[k])}" for k in ("algorithm", "codec", "server_optimizer", "mode", "phase"))
    ckpt = data["checkpoint"]
    ckpt_line = ("no checkpoints configured" if ckpt is None else "no checkpoint yet" if ckpt["step"] is None
                 else f"step {ckpt['step']}, {ckpt['age_s']:.0f} s ago ({_cell(ckpt['dir'])})")
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><meta http-equiv='refresh' content='{REFRESH_S}'>",
             "<title>geomx job</title><style>body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse;"
             "margin-bottom:1.2em}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}"
             ".dead{background:#fdd}.rejoining,.waiting{background:#ffd}.left{color:#888}</style></head><body>",
             f"<h1>geomx job</h1><p id='job'>{facts}; global round: {_cell(job['global_round'])}; "
             f"up {job['uptime_s']:.0f} s</p><p id='checkpoint'>last checkpoint: {ckpt_line}</p>"]
    if _model(job):
        parts.append(f"<p id='model'>{_cell(_model(job))}</p>")
    if data["missing"]:
        parts.append(f"<p id='missing'>waiting for: {_cell(data['missing'])}</p>")
    for party in data["parties"]:
        name = html.escape(party["name"])
        wan, rate = party["wan_bytes"], party["wan_rate_bps"]
        parts.append(f"<h2>{name}{' (central)' if party['central'] else ''}</h2><p class='traffic'>step "
                     f"{_cell(party['step'])}; WAN sent {_bytes(wan['sent'])} ({_rate(rate['sent'])}), received "
                     f"{_bytes(wan['recv'])} ({_rate(rate['recv'])}); LAN {_bytes(sum(party['lan_bytes'].values()))}"
                     f"{_saved(party)}{_staleness(party)}{_outer(party)}</p>"
                     f"<table class='party' id='party-{name}' data-party='{name}'><tr><th>member</th><th>role</th>"
                     "<th>state</th><th>step</th><th>busy</th><th>mean round</th><th>model</th><th>heartbeat age</th>"
                     "<th>WAN sent</th><th>WAN received</th></tr>")
        for m in party["members"]:
            busy = None if m["busy"] is None else f"{100 * m['busy']:.0f}%"
            age = None if m["heartbeat_age_s"] is None else f"{m['heartbeat_age_s']:.1f} s"
            model = None if not m.get("model") else f"{m['model']['step']}: {m['model']['digest'][:12]}"
            parts.append(f"<tr class='member {html.escape(m['state'])}' data-party='{name}'><td>{_cell(m['name'])}"
                         f"</td><td>{_cell(m['role'])}</td><td class='state'>{_cell(m['state'])}</td>"
                         f"<td>{_cell(m['step'])}</td><td>{_cell(busy)}</td><td>{_cell(_mean_round(m))}</td>"
                         f"<td class='model'>{_cell(model)}</td><td>{_cell(age)}</td>"
                         f"<td>{_bytes(m['wan_bytes']['sent'])}</td><td>{_bytes(m['wan_bytes']['recv'])}</td></tr>")
        parts.append("</table>")
    parts.append("<p><a href='status.json'>status.json</a> · <a href='metrics'>metrics</a></p></body></html>")
    return "".join(parts)


def render_text(data: dict[str, Any]) -> str:
    """The page for a terminal (``geomx status HOST:PORT``): the job's line, then a table per party, with the
    page's numbers (a MixedSync job's push staleness, the LAN and the codecs' savings, the servers' mean round)."""
    job, ckpt = data["job"], data["checkpoint"]
    lines = [f"job      : {job['algorithm']}, codec {job['codec']}, server optimizer {job['server_optimizer']}, "
             f"{job['mode']}; {job['phase']}, global round {_text(job['global_round'])}, up {job['uptime_s']:.0f} s",
             "checkpoint: " + ("not configured" if ckpt is None else "none yet" if ckpt["step"] is None
                               else f"step {ckpt['step']}, {ckpt['age_s']:.0f} s ago")]
    if _model(job):
        lines.append(str(_model(job)))
    if data["missing"]:
        lines.append(f"waiting for: {data['missing']}")
    for party in data["parties"]:
        wan, rate = party["wan_bytes"], party["wan_rate_bps"]
        lines += ["", f"{party['name']}{' (central)' if party['central'] else ''}: step {_text(party['step'])}, "
                      f"WAN sent {_bytes(wan['sent'])} ({_rate(rate['sent'])}), received {_bytes(wan['recv'])} "
                      f"({_rate(rate['recv'])}); LAN {_bytes(sum(party['lan_bytes'].values()))}{_saved(party)}"
                      f"{_staleness(party)}{_outer(party)}",
                  f"  {'member':<22}{'state':<11}{'step':>8}{'busy':>7}{'mean round':>12}{'heartbeat':>11}"
                  f"{'WAN sent':>12}{'WAN recv':>12}"]
        for m in party["members"]:  # the page's columns (docs/deployment.md), but the role and the digest
            busy = "—" if m["busy"] is None else f"{100 * m['busy']:.0f}%"
            age = "—" if m["heartbeat_age_s"] is None else f"{m['heartbeat_age_s']:.1f} s"
            lines.append(f"  {m['name']:<22}{m['state']:<11}{_text(m['step']):>8}{busy:>7}{_text(_mean_round(m)):>12}"
                         f"{age:>11}{_bytes(m['wan_bytes']['sent']):>12}{_bytes(m['wan_bytes']['recv']):>12}")
    return "\n".join(lines)


def _text(value: Any) -> str:
    return "—" if value is None else str(value)


class StatusServer:
    """The HTTP server (see the module docstring); ``start`` binds (OSError if it cannot), ``stop`` ends it."""

    def __init__(self, host: str, port: int, snapshot: Snapshot) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(JobCollector(snapshot))
        self._snapshot = snapshot
        self._host, self._port = host, port
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """``http://HOST:PORT/`` (an address that reaches it: 127.0.0.1 when bound to every interface)."""
        assert self._server is not None, "not started"
        host, port = self._server.server_address[:2]
        host = "127.0.0.1" if host in ("0.0.0.0", "") else str(host)
        return f"http://{host}:{port}/"

    def start(self) -> StatusServer:
        server = ThreadingHTTPServer((self._host, self._port), self._handler())
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="geomx-status-http", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        snapshot, registry = self._snapshot, self.registry

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                try:
                    if path in ("/", "/index.html"):
                        self._send(200, "text/html; charset=utf-8", render_html(snapshot()).encode())
                    elif path == "/status.json":
                        self._send(200, "application/json", json.dumps(snapshot(), indent=1).encode())
                    elif path == "/metrics":
                        self._send(200, CONTENT_TYPE_LATEST, generate_latest(registry))
                    else:
                        self._send(404, "text/plain", b"not found: try /, /status.json or /metrics\n")
                except Exception as exc:  # a bug in a page must not end the server thread silently
                    log.exception("status page %s failed", path)
                    self._send(500, "text/plain", f"{type(exc).__name__}: {exc}\n".encode())

            def _send(self, code: int, kind: str, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("status page: " + format, *args)

        return Handler


def announce_when_listening(url: str, out: IO[str], timeout: float, ended: threading.Event) -> threading.Thread:
    """Print ``status : URL`` once the page accepts connections (after the scheduler's bind, not before), from a
    daemon thread that gives up silently after ``timeout`` or when the job has ``ended`` (the scheduler says why
    it has no page itself)."""
    parts = url.removeprefix("http://").rstrip("/").rsplit(":", 1)

    def wait() -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not ended.is_set():
            try:
                socket.create_connection((parts[0], int(parts[1])), timeout=1.0).close()
            except OSError:
                ended.wait(0.05)
                continue
            out.write(f"[geomx launch] status : {url}\n")
            out.flush()
            return

    thread = threading.Thread(target=wait, name="geomx-status-announce", daemon=True)
    thread.start()
    return thread
