"""How a worker's slices travel: one sender for the kvstore's keys and a collective rank's owned slices alike.

A slice goes up as one message: INIT (the master's values, or none, and the digest of what the worker holds) or
PUSHPULL (its payload, encoded by the codec it travels in), to the server holding it, and its answer is waited for
at most the request timeout (and ``VERDICT_S``), naming the server, the key and the slice. ``geomx.kv.KVStore`` sends
every slice of a key through it; a rank of a collective party (``geomx.worker.ranks``) the slices it owns.

Usage::

    sender = SliceSender(requests, keys, route, codecs, timeout_s=30.0)
    codec = sender.codec(configured, tensor)          # the configured codec; bfloat16's bits where it fits
    future = sender.push(key, index, piece, codec, priority=0)
    futures = sender.push_together([sender.pushpull(key, i, piece, codec, 0) for i, piece in owned])  # bundled
    data = sender.data(sender.reply(future, key, index, "PUSHPULL"), key, index)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np
import torch

from ..codecs import Codec, Registry
from ..codecs.base import TensorKind
from ..codecs.messages import decode_message
from ..core.worker_plugins import PushRoute
from ..protocol.bodies import TOKENS, InitBody, encode_body
from ..protocol.tensors import readonly_tensor
from ..protocol.wire import Kind, Message
from ..transport.rpc import Requests
from .slices import KeyTable, payload, push_codec

# A round's answer is awaited this much beyond the request timeout. Why: a server gives up on a round after the round
# timeout (often the same: GEOMX_TIMEOUT sets both) and answers with whom it waited for; that verdict, which names the
# process that stopped sending, should reach the worker before the worker's own, bare timeout.
VERDICT_S = 2.0


@dataclass
class SliceSender:
    """What a worker needs to send its slices: requests, the keys' slices, the push route, codecs, the timeout."""

    requests: Requests
    keys: KeyTable
    route: PushRoute
    codecs: Registry
    timeout_s: float

    def server(self, key: int, index: int) -> str:
        """The server holding slice ``index`` of ``key`` (the one its messages go to)."""
        return self.keys.server_for(key, index)

    def server_name(self, key: int, index: int) -> str:
        return self.requests.names.get(self.server(key, index), "?")

    def codec(self, configured: Codec | None, tensor: torch.Tensor) -> Codec | None:
        """The codec a push of ``tensor`` travels in (``configured``, or bfloat16's bits: ``slices.push_codec``)."""
        return push_codec(configured, tensor, self.route.carries_codecs)

    def init(self, key: int, index: int, piece: np.ndarray, values: bool, digest: str | None = None
             ) -> Future[Message]:
        """INIT slice ``index`` of ``key`` (with ``piece``'s values if ``values``; ``digest``: of what the worker
        holds, see ``geomx.core.inits``); the answer's future."""
        info = self.keys[key]
        message = Message(Kind.INIT, key=key, slice=index, num_slices=len(info.slices),
                          tensor=piece if values else None, dtype=piece.dtype, shape=piece.shape,
                          body=encode_body(InitBody(shard=info.shards[index], numel=math.prod(info.shape),
                                                    digest=digest)))
        return self.requests.call(self.server(key, index), message)

    def push(self, key: int, index: int, piece: np.ndarray, codec: Codec | None, priority: int,
             kind: TensorKind = "gradient", tokens: int | None = None) -> Future[Message]:
        """Push slice ``index`` of ``key`` (``piece``: its data on the host, not to be changed until its frames are
        sent) through the push route, encoded by ``codec`` (``kind``: what it holds; ``tokens``: the samples behind
        it, reported in the body); the answer's future."""
        return self.route.push(self.server(key, index),
                               self.pushpull(key, index, piece, codec, priority, kind, tokens))

    def pushpull(self, key: int, index: int, piece: np.ndarray, codec: Codec | None, priority: int,
                 kind: TensorKind = "gradient", tokens: int | None = None) -> Message:
        """The PUSHPULL of slice ``index`` of ``key`` that ``push`` sends."""
        info = self.keys.info(key)
        fields = payload(codec, key, index, piece, math.prod(info.shape), kind)
        if tokens is not None:
            fields["body"] = {**(fields.get("body") or {}), TOKENS: tokens}
        return Message(Kind.PUSHPULL, key=key, slice=index, num_slices=len(info.slices), priority=priority,
                       **fields)

    def push_together(self, messages: Sequence[Message]) -> list[Future[Message]]:
        """Push ``messages`` (``pushpull``'s), those for one server as few messages as fit (``PushRoute.push_together``:
        BUNDLEs on the direct route); the answers' futures, in order."""
        by_server: dict[str, list[int]] = {}
        for position, message in enumerate(messages):
            by_server.setdefault(self.server(message.key, message.slice), []).append(position)
        futures: list[Future[Message] | None] = [None] * len(messages)
        for server, positions in by_server.items():
            sent = self.route.push_together(server, [messages[p] for p in positions])
            for position, future in zip(positions, sent, strict=True):
                futures[position] = future
        return [future for future in futures if future is not None]

    def reply(self, future: Future[Message], key: int, index: int, what: str) -> Message:
        """A slice's answer, waiting at most the request timeout and ``VERDICT_S``."""
        return self.requests.wait(future, self.timeout_s + VERDICT_S, f"{self.server_name(key, index)} to answer "
                                                                      f"{what} of key {key} slice {index}")

    def replies(self, futures: Sequence[Future[Message]], key: int, what: str) -> list[Message]:
        """The answers of every slice of ``key``, in order."""
        return [self.reply(future, key, index, what) for index, future in enumerate(futures)]

    def data(self, reply: Message, key: int, index: int) -> torch.Tensor:
        """The decoded data of ``reply`` (a read-only tensor)."""
        data = decode_message(self.codecs, reply)
        if data is None:
            raise RuntimeError(f"{self.server_name(key, index)} answered key {key} slice {index} without data")
        return readonly_tensor(data)
