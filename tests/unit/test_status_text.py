"""`geomx status HOST:PORT` prints the status page in a terminal (docs/deployment.md, "Operating a job"): the page's
party line (its LAN bytes, what its codecs saved, SSP's answers ahead, MixedSync's push staleness) and its members'
mean round and WAN bytes. The terminal form used to leave all of these out, so a MixedSync job's staleness, which
the doc says a party's line shows, was only on the page."""

from __future__ import annotations

from typing import Any

from geomx.cluster.status_page import render_html, render_text


def _member(name: str, role: str, **extra: Any) -> dict[str, Any]:
    return {"id": f"dc1/{role}/1", "name": name, "role": role, "party": "dc1", "rank": 0, "state": "training",
            "heartbeat_age_s": 0.4, "step": 12, "busy": None, "wan_bytes": {"sent": 2_500_000, "recv": 2_400_000},
            "lan_bytes": {"sent": 1, "recv": 1}, "saved_bytes": {"lan": 0, "wan": 0}, "rounds": None,
            "answers_ahead": None, "push_staleness": None, "outer_rounds": None, "model": None, **extra}


def _snapshot() -> dict[str, Any]:
    job = {"algorithm": "dist_async", "sync": "dist_async", "server_optimizer": "dcasgd", "codec": "fp16",
           "mode": "hips", "central": "dc0", "global_servers": 1, "parties": ["dc1"], "phase": "training",
           "uptime_s": 9.0, "global_round": 12,
           "model": {"step": None, "parties": {}, "agree": True, "disagreements": 0, "last_disagreement": None}}
    party = {"name": "dc1", "central": False, "lan": "server", "workers": 1, "step": 12,
             "wan_bytes": {"sent": 2_500_000, "recv": 2_400_000}, "lan_bytes": {"sent": 3_000_000, "recv": 0},
             "codec_saved_bytes": {"wan": 1_200_000, "lan": 0}, "wan_rate_bps": {"sent": 1e6, "recv": 1e6},
             "answers_ahead": None, "push_staleness": {"0": 3, "2": 1}, "outer_rounds": None,
             "members": [_member("dc1/server", "local_server", rounds={"count": 4, "seconds": 0.1})]}
    return {"job": job, "parties": [party], "missing": None, "checkpoint": None}


def test_the_terminal_shows_the_party_line_and_the_member_columns_of_the_page():
    data = _snapshot()
    text = render_text(data)
    for words in ("LAN 3.00 MB", "the codecs saved 1.20 MB of WAN", "pushes stale by: mean 0.50, max 2 updates"):
        assert words in text and words in render_html(data), (words, text)
    row = next(line for line in text.splitlines() if line.strip().startswith("dc1/server"))
    assert "25.0 ms" in row and "2.50 MB" in row and "2.40 MB" in row, row

