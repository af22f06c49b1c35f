"""Model digests (geomx.torch.digest, geomx.cluster.digests) and push staleness on the status page: without a job,
boards fed heartbeat reports by hand."""

from __future__ import annotations

import logging

import pytest
import torch
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from geomx.cluster.digests import DigestBook
from geomx.cluster.status import MemberRow, StatusBoard
from geomx.cluster.status_page import StatusServer, render_html, render_text
from geomx.config import topology_from_dict
from geomx.protocol.bodies import HeartbeatBody, decode_body, encode_body
from geomx.torch.digest import CHUNK, KEEP, ModelDigests, model_digest


def test_a_digest_is_bit_exact_and_sees_one_bit_a_swap_and_the_order() -> None:
    torch.manual_seed(0)
    tensors = [torch.randn(CHUNK + 4099), torch.randn(7, 3).to(torch.bfloat16), torch.randn(5).double()]
    digest = model_digest(tensors)
    assert len(digest) == 16 and digest == model_digest([t.clone() for t in tensors])
    flipped = tensors[0].clone()
    flipped.view(torch.int32)[CHUNK + 4098] ^= 1  # the last bit of the last element, in the second chunk's tail
    swapped = tensors[0].clone()
    swapped[[3, 4]] = swapped[[4, 3]]
    others = {model_digest([flipped, *tensors[1:]]), model_digest([swapped, *tensors[1:]]),
              model_digest(tensors[::-1]), model_digest(tensors[:2]), model_digest([t.flip(0) for t in tensors])}
    assert digest not in others and len(others) == 5
    assert model_digest([torch.zeros(3)]) != model_digest([torch.zeros(4)])


class FakeLoop:
    def __init__(self) -> None:
        self.params = [torch.nn.Parameter(torch.ones(10))]
        self.steps_done = 0
        self.synchronized = 0

    def synchronize(self) -> None:
        self.synchronized += 1


def test_digests_are_taken_at_multiples_of_a_power_of_two_about_one_a_heartbeat() -> None:
    now = [0.0]
    loop, noted = FakeLoop(), []
    digests = ModelDigests(loop, lambda: loop.steps_done, noted.append, interval_s=1.0, clock=lambda: now[0])
    taken = []
    for _ in range(100):  # steps of 0.1 s: 8 of them (the power of two up to 1 s) between digests
        digests.before_step()
        if noted and (not taken or noted[-1] != taken[-1]):
            taken.append(noted[-1])
        loop.steps_done += 1
        now[0] += 0.1
    steps = sorted(int(s) for s in digests.recent)
    assert digests.period == 8 and steps[-1] == 96 and all(s % 8 == 0 for s in steps[-4:])
    assert len(digests.recent) == KEEP and loop.synchronized == len(taken)  # every digest after the answers landed
    assert set(digests.recent.values()) == {model_digest(loop.params)}  # the model never moved
    never = ModelDigests(loop, lambda: None, noted.append, interval_s=1.0)  # a model of its own: nothing digested
    never.before_step()
    assert never.recent == {}



def test_the_final_model_is_digested_at_close_whatever_the_period() -> None:
    """A job of few fast steps digests step 0 and then maybe nothing: a party whose steps were slower keeps a shorter
    period, so no later step was compared. ``at_close`` digests the last step on every party, once."""
    now = [0.0]
    loop, noted = FakeLoop(), []
    digests = ModelDigests(loop, lambda: loop.steps_done, noted.append, interval_s=1.0, clock=lambda: now[0])
    for _ in range(5):  # steps of 0.1 s: period 8, only step 0 digested
        digests.before_step()
        loop.steps_done += 1
        now[0] += 0.1
    assert sorted(digests.recent) == ["0"]
    loop.params[0].data.add_(1.0)
    digests.at_close()
    digests.at_close()  # once
    assert sorted(digests.recent, key=int) == ["0", "5"] and len(noted) == 2
    assert digests.recent["5"] == model_digest(loop.params) != digests.recent["0"]
    never = ModelDigests(loop, lambda: None, noted.append, interval_s=1.0)
    never.at_close()
    assert never.recent == {}

def topology():
    return topology_from_dict({"parties": {"dc0": 1, "dc1": 1, "dc2": 1}})


ROWS = [MemberRow("ls0", "dc0/server", "local_server", "dc0", 0, "training"),
        MemberRow("ls1", "dc1/server", "local_server", "dc1", 0, "training"),
        MemberRow("ls2", "dc2/server", "local_server", "dc2", 0, "training")]


def relayed(party_board: StatusBoard, worker: str, models: dict[str, str]) -> HeartbeatBody:
    """A local server's heartbeat carrying its party scheduler's record of ``worker`` (who reported ``models``)."""
    party_board.seen(worker, worker.split("/")[0])
    party_board.heard(worker, HeartbeatBody(step=1, models=models), name=worker)
    relay = party_board.members([MemberRow(worker, worker, "worker", worker.split("/")[0], 0, "training")])
    return decode_body(HeartbeatBody, encode_body(HeartbeatBody(party=relay)))


def test_the_board_names_the_parties_that_disagree_once_and_counts_every_step(caplog) -> None:
    board = StatusBoard(topology(), owner="global_scheduler")
    for row in ROWS:
        board.seen(row.id, row.party)
    same, other = "5f1c" * 4, "a0b1" * 4
    with caplog.at_level(logging.WARNING, logger="geomx.cluster.status"):
        for party in ("dc0", "dc1", "dc2"):  # relayed by each party's scheduler and local server
            board.heard(f"ls{party[-1]}", relayed(StatusBoard(topology()), f"{party}/worker0", {"8": same}))
        data = board.snapshot(ROWS, {}, "training")
        model = data["job"]["model"]
        assert model["step"] == 8 and model["agree"] and model["disagreements"] == 0
        assert model["parties"] == {"dc0": [same], "dc1": [same], "dc2": [same]} and caplog.records == []
        assert data["parties"][1]["members"][1]["model"] == {"step": 8, "digest": same}
        board.heard("ls0", relayed(StatusBoard(topology()), "dc0/worker0", {"8": same, "16": same}))
        board.heard("ls1", relayed(StatusBoard(topology()), "dc1/worker0", {"8": same, "16": other}))
        board.heard("ls2", relayed(StatusBoard(topology()), "dc2/worker0", {"16": same, "24": other}))
        board.heard("ls0", relayed(StatusBoard(topology()), "dc0/worker0", {"24": same}))  # the same two, again
    assert [r.getMessage() for r in caplog.records] == [
        # judged when dc1's came (dc2's, the same as dc0's, came later)
        f"[global_scheduler] parties dc0 and dc1 disagree on the model at step 16: digests {same[:12]}.. (dc0) vs "
        f"{other[:12]}.. (dc1)",
        f"[global_scheduler] parties dc0 and dc2 disagree on the model at step 24: digests {same[:12]}.. (dc0) vs "
        f"{other[:12]}.. (dc2)"]
    data = board.snapshot(ROWS, {}, "training")
    model = data["job"]["model"]
    assert model["step"] == 16 and model["agree"] is False and model["disagreements"] == 2  # 24: dc1 said nothing
    assert model["last_disagreement"] == {"step": 24, "digests": {"dc0": same, "dc2": other}}
    assert "DISAGREE" in render_html(data) and f"dc1 {other[:12]}" in render_text(data)
    page = StatusServer("127.0.0.1", 0, lambda: board.snapshot(ROWS, {}, "training"))
    found = {(s.name, s.labels.get("party")): s.value
             for f in text_string_to_metric_families(generate_latest(page.registry).decode()) for s in f.samples}
    assert found[("geomx_model_disagreements_total", None)] == 2
    assert found[("geomx_model_digest_step", "dc2")] == 24


def test_a_rejoined_partys_digests_are_not_compared_with_the_jobs_steps(caplog) -> None:
    """A party restarted into a running job (a lost party, or a collective party's ranks restarted by torchrun)
    counts its steps from its restart: its digest of "step 0" is of the current global model, not the job's first.
    Before, the global scheduler compared it with the others' step 0 and logged a disagreement (seen in the chaos
    bench's rank_lost); now the party's digests after its rejoin are left out, the others' still compared."""
    board = StatusBoard(topology(), owner="global_scheduler")
    for row in ROWS:
        board.seen(row.id, row.party)
    first, later, other = "5f1c" * 4, "77aa" * 4, "a0b1" * 4
    with caplog.at_level(logging.WARNING, logger="geomx.cluster.status"):
        for party in ("dc0", "dc1", "dc2"):
            board.heard(f"ls{party[-1]}", relayed(StatusBoard(topology()), f"{party}/worker0", {"0": first}))
        board.seen("ls2b", "dc2")
        board.rejoined("dc2")  # the scheduler's rejoin of dc2's server in place of the dead one
        board.heard("ls2b", relayed(StatusBoard(topology()), "dc2/worker0", {"0": other, "16": other}))
        for party in ("dc0", "dc1"):
            board.heard(f"ls{party[-1]}", relayed(StatusBoard(topology()), f"{party}/worker0", {"16": later}))
    assert caplog.records == []
    model = board.snapshot(ROWS, {}, "training")["job"]["model"]
    assert model["disagreements"] == 0 and model["agree"] and model["step"] == 16, model
    assert model["parties"] == {"dc0": [later], "dc1": [later]}


def test_members_of_one_party_that_disagree_are_named(caplog) -> None:
    book = DigestBook("dc1/scheduler")
    with caplog.at_level(logging.WARNING, logger="geomx.cluster.status"):
        book.add("dc1", "dc1/worker0", {"4": "aa" * 8, "x": "ignored"})
        book.add("dc1", "dc1/worker1", {"4": "bb" * 8})
    assert caplog.records[0].getMessage().startswith("[dc1/scheduler] members dc1/worker0 and dc1/worker1 disagree")
    assert book.summary()["parties"] == {"dc1": ["aa" * 8, "bb" * 8]}


def test_push_staleness_from_the_global_servers_reaches_the_page_and_a_histogram() -> None:
    board = StatusBoard(topology())
    board.seen("gs0", "dc0")
    board.seen("ls1", "dc1")
    board.heard("gs0", HeartbeatBody(push_staleness={"dc1/server": {"0": 3, "1": 4, "9": 1}}))
    rows = [MemberRow("gs0", "global_server0", "global_server", "dc0", 0, "training"), ROWS[1]]
    data = board.snapshot(rows, {}, "training")
    dc1 = next(p for p in data["parties"] if p["name"] == "dc1")
    assert dc1["push_staleness"] == {"0": 3, "1": 4, "9": 1} == dc1["members"][0]["push_staleness"]
    assert "pushes stale by: mean 1.62, max 9 updates" in render_html(data)
    page = StatusServer("127.0.0.1", 0, lambda: board.snapshot(rows, {}, "training"))
    found = {(s.name, s.labels.get("le")): s.value
             for f in text_string_to_metric_families(generate_latest(page.registry).decode())
             if f.name == "geomx_push_staleness_updates" for s in f.samples}
    assert (found[("geomx_push_staleness_updates_bucket", "0")], found[("geomx_push_staleness_updates_bucket", "1")],
            found[("geomx_push_staleness_updates_bucket", "8")],
            found[("geomx_push_staleness_updates_bucket", "16")]) == (3, 7, 7, 8)
    assert found[("geomx_push_staleness_updates_sum", None)] == pytest.approx(13)
