"""The wan bench's WAN streams: each geomx process's WAN bytes read from its party's run folder, and the line
that says how a collective party's ranks share them."""

from __future__ import annotations

import json
from pathlib import Path

from geomx.bench.wan.runs import wan_streams
from geomx.bench.wan.section import stream_line


def write_stats(run_dir: Path, name: str, party: str, wan_sent: int) -> None:
    (run_dir / "stats").mkdir(parents=True, exist_ok=True)
    entry = {"name": name, "party": party, "lan": {"sent": 5, "recv": 5}, "wan": {"sent": wan_sent, "recv": 1}}
    (run_dir / "stats" / f"{name.replace('/', '_')}.json").write_text(json.dumps(entry))


def test_each_rank_of_a_collective_party_is_a_stream_and_the_balance_is_said(tmp_path: Path) -> None:
    write_stats(tmp_path / "run-dc0", "global_server0", "dc0", 50_000_000)
    write_stats(tmp_path / "run-dc0", "dc0/worker0", "dc0", 0)  # the central party's ranks: no WAN
    write_stats(tmp_path / "run-dc1", "dc1/worker0", "dc1", 26_000_000)
    write_stats(tmp_path / "run-dc1", "dc1/worker1", "dc1", 24_000_000)
    streams = wan_streams(tmp_path)
    assert streams == {"dc0": {"global_server0": 50_000_000}, "dc1": {"worker0": 26_000_000, "worker1": 24_000_000}}
    assert stream_line(streams) == ("WAN streams: dc0 1 stream (global_server0 50.0 MB; largest / smallest 1.00); "
                                    "dc1 2 streams (worker0 26.0 MB, worker1 24.0 MB; largest / smallest 1.08)")
    assert wan_streams(tmp_path / "nothing") == {}  # a peer's run: no geomx run folders
