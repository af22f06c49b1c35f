"""Early answers of float16 keys: the others' sum crosses the WAN as float16 where that is exact (one other party),
and the last party's answer is the global server's bit for bit.

Why: the global server sums float16 pushes in float32; sending that float32 sum as the early answer doubled the
answer's WAN bytes (``examples/cnn_fp16.py``: 20.3 MB over the WAN against 13.6 MB without early answers).
"""

from __future__ import annotations

import numpy as np

from geomx.algorithms.fsa.server import FullySynchronous
from geomx.codecs.half import from_half
from geomx.core.clients import Clients
from geomx.core.early import EarlyAnswers, send_early
from geomx.core.rounds import Round, RoundTable
from geomx.protocol.wire import Kind, Message


class Host:
    """Records what the table sends; completed rounds are answered by the test."""

    name = "global"

    def __init__(self) -> None:
        self.sent: list[tuple[str, Message]] = []
        self.completed: list[Round] = []

    def send(self, peer: str, message: Message) -> None:
        self.sent.append((peer, message))

    def complete(self, rnd: Round) -> None:
        self.completed.append(rnd)

    def display(self, client: str) -> str:
        return client


def _push(sender: str, tensor: np.ndarray) -> Message:
    message = Message(Kind.PUSHPULL, key=0, tensor=tensor, request_id=1)
    message.sender = sender.encode()
    return message


def _values(seed: int, n: int = 4096) -> np.ndarray:
    """float16 values over float16's whole range, subnormals included, where sums round twice."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(n) * np.exp2(rng.integers(-24, 14, n))).astype(np.float16)


def test_two_parties_early_sum_of_float16_pushes_is_float16_and_bit_for_bit() -> None:
    host = Host()
    table = RoundTable(host, Clients(["dc0", "dc1"]), FullySynchronous(), clock=lambda: 0.0)
    first, last = _values(0), _values(1)
    table.contribute(_push("dc0", first))
    rnd = table.get(Kind.PUSHPULL, 0, 0)
    assert rnd is not None
    send_early(host, rnd, table.awaited(rnd))
    [(peer, early)] = host.sent
    assert peer == "dc1" and early.tensor is not None
    assert early.tensor.dtype == np.float16 and early.tensor.nbytes == first.nbytes  # not float32's twice
    table.contribute(_push("dc1", last))
    [done] = host.completed
    assert done.accum is not None
    full = done.accum.astype(np.float16)  # what the global server answers (the declared dtype)
    local, got = EarlyAnswers(), []
    early.sender = b"global"
    local.store("global", early)
    local.forwarded("global", 0, 0, last, got.append)
    [answer] = got
    np.testing.assert_array_equal(answer.astype(np.float16).view(np.uint16), full.view(np.uint16))
    np.testing.assert_array_equal(from_half(early.tensor), from_half(first))
