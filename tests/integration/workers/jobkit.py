"""What the integration workers and the tests share: the model, the data, the reference run, fault injection.

Workers import this module as ``jobkit`` (it sits next to them, so it is on their ``sys.path``); the tests
import it the same way (``conftest.py`` puts this folder on ``sys.path``). Both sides therefore build the
model and the data with the very same code.
"""

from __future__ import annotations

import gc

gc.disable()  # torch's import allocates ~170K long-lived objects; collecting them is ~0.3 CPU-s per worker
import json
import logging
import os
import random
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

gc.freeze()  # what the imports made lives as long as the process: no collection needs to scan it
gc.enable()

STEPS = 5
LR = 0.1
MOMENTUM = 0.9
BATCH = 8
IN_FEATURES = 32
HIDDEN = 64
OUT_FEATURES = 3
DATA_SEED = 1234
OUT_DIR = "out"


def seed_for(global_rank: int) -> int:
    """Every worker seeds differently on purpose: only kv.init makes their weights equal (the master's)."""
    return 100 + 7 * global_rank


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(IN_FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, OUT_FEATURES))


def param_bytes() -> int:
    return sum(p.numel() * p.element_size() for p in make_model().parameters())


def make_data(steps: int, num_workers: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs (steps, workers, BATCH, IN) and targets (steps, workers, BATCH, OUT); batch [s, r] is rank r's."""
    generator = torch.Generator().manual_seed(DATA_SEED)
    inputs = torch.randn(steps, num_workers, BATCH, IN_FEATURES, generator=generator)
    targets = torch.randn(steps, num_workers, BATCH, OUT_FEATURES, generator=generator)
    return inputs, targets


def reference_run(num_workers: int, steps: int = STEPS, lr: float = LR, momentum: float = MOMENTUM,
                  master_rank: int = 0, clip: float | None = None) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """One process, torch.optim.SGD, the union of every worker's batch per step (mean loss over the union), its
    gradient clipped to norm ``clip`` if given.

    Returns (initial weights, final weights). The initial weights are the master worker's.
    """
    torch.manual_seed(seed_for(master_rank))
    model = make_model()
    initial = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    inputs, targets = make_data(steps, num_workers)
    for step in range(steps):
        optimizer.zero_grad()
        loss = F.mse_loss(model(inputs[step].reshape(-1, IN_FEATURES)), targets[step].reshape(-1, OUT_FEATURES))
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
    return initial, [p.detach().clone() for p in model.parameters()]


def reference_after(steps: int, total_steps: int, num_workers: int,
                    make_optimizer: Callable[[Any], torch.optim.Optimizer]) -> list[torch.Tensor]:
    """The single-process reference model after ``steps`` of a ``total_steps``-step run's data (``reference_run``
    draws data for as many steps as it runs, so a shorter run sees different batches): the master's initial model,
    ``make_optimizer(parameters)`` on the mean loss over every worker's batch."""
    torch.manual_seed(seed_for(0))
    model = make_model()
    optimizer = make_optimizer(model.parameters())
    inputs, targets = make_data(total_steps, num_workers)
    for step in range(steps):
        optimizer.zero_grad()
        F.mse_loss(model(inputs[step].reshape(-1, IN_FEATURES)), targets[step].reshape(-1, OUT_FEATURES)).backward()
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


def local_sgd(workers: list[list[torch.Tensor]], steps: int, batches: list[int] | None = None) -> Iterator[int]:
    """The local steps of a simulated HFA job: for each step 1..``steps``, every rank's weights ``workers[rank]``
    take one plain SGD step (LR, no momentum) on its own batch of ``make_data(steps, len(workers))``, then the step
    is yielded. The caller syncs between yields by assigning into ``workers`` (a round's averages or answers); the
    next step reads them. One loop for every simulation, so they all step the same arithmetic as the workers.
    ``batches``: each rank's batch size, the first samples of its batch (default: all ``BATCH``)."""
    inputs, targets = make_data(steps, len(workers))
    model = make_model()
    for step in range(1, steps + 1):
        for rank, weights in enumerate(workers):
            with torch.no_grad():
                for p, w in zip(model.parameters(), weights, strict=True):
                    p.copy_(w)
            model.zero_grad()
            batch = BATCH if batches is None else batches[rank]
            F.mse_loss(model(inputs[step - 1, rank, :batch]), targets[step - 1, rank, :batch]).backward()
            workers[rank] = [w - LR * p.grad for w, p in zip(weights, model.parameters(), strict=True)]
        yield step


# -- worker output files ---------------------------------------------------------------------------------

def out_dir(run_dir: Path) -> Path:
    folder = Path(run_dir) / OUT_DIR
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def save_worker_output(run_dir: Path, global_rank: int, tensors: dict[str, list[torch.Tensor]],
                       report: dict[str, Any]) -> None:
    from geomx.runs.checkpoint import write_atomically

    folder = out_dir(run_dir)
    torch.save(tensors, folder / f"worker{global_rank}.pt")
    report_bytes = json.dumps(report, indent=1, default=str).encode()
    # whole or absent: other workers wait on it
    write_atomically(folder / f"worker{global_rank}.json", lambda handle: handle.write(report_bytes))


def load_worker_outputs(run_dir: Path) -> dict[int, tuple[dict[str, list[torch.Tensor]], dict[str, Any]]]:
    """global rank -> (tensors, report) for every worker that finished."""
    folder = Path(run_dir) / OUT_DIR
    result = {}
    for path in sorted(folder.glob("worker*.pt")):
        rank = int(path.stem.removeprefix("worker"))
        report = json.loads(path.with_suffix(".json").read_text())
        result[rank] = (torch.load(path, weights_only=True), report)
    return result


# -- fault injection (runs inside a worker) -------------------------------------------------------------

def bad_requests(kv: Any) -> dict[str, dict[str, str]]:
    """Send malformed-but-decodable requests to this worker's first server, bypassing kv's own checks.

    Returns case -> {"outcome": exception class name or "reply:<KIND>", "text": ...}.
    """
    from geomx.protocol.wire import Kind, Message
    from geomx.transport.rpc import RemoteError

    server = kv._servers[0]
    info = kv._keys[0]
    num_slices = len(info.slices)
    n0 = info.slices[0][1] - info.slices[0][0]
    cases = {
        "wrong_shape": Message(Kind.PUSHPULL, key=0, slice=0, num_slices=num_slices,
                               tensor=np.zeros(n0 + 3, np.float32)),
        "wrong_dtype": Message(Kind.PUSHPULL, key=0, slice=0, num_slices=num_slices, tensor=np.zeros(n0, np.float64)),
        "no_tensor": Message(Kind.PUSHPULL, key=0, slice=0, num_slices=num_slices),
        "unknown_key": Message(Kind.PUSHPULL, key=999, tensor=np.zeros(4, np.float32)),
        "unknown_slice": Message(Kind.PUSHPULL, key=0, slice=num_slices + 2, num_slices=num_slices + 3,
                                 tensor=np.zeros(n0, np.float32)),
        "pull_uninitialized": Message(Kind.PULL, key=12345),
        "init_conflicting_shape": Message(Kind.INIT, key=0, slice=0, num_slices=num_slices, dtype=np.dtype(np.float32),
                                          shape=(n0 + 1,)),
        "unsupported_kind": Message(Kind.HEARTBEAT),
    }
    # The servers check the sender before the spec: only the master worker's path may configure them.
    optimizer_case = "bogus_optimizer" if kv.is_master_worker else "optimizer_from_non_master"
    cases[optimizer_case] = Message(Kind.CONFIGURE, body={"optimizer": {"name": "bogus", "params": {}}})
    results: dict[str, dict[str, str]] = {}
    for name, message in cases.items():
        future = kv._requests.call(server, message)
        try:
            reply = kv._requests.wait(future, 20.0, f"the answer to the {name} request")
            results[name] = {"outcome": f"reply:{reply.kind.name}", "text": ""}
        except RemoteError as exc:
            results[name] = {"outcome": "RemoteError", "text": str(exc)}
        except Exception as exc:
            results[name] = {"outcome": type(exc).__name__, "text": str(exc)}
    results["expected_sizes"] = {"outcome": "info", "text": json.dumps({"n0": n0, "num_slices": num_slices})}
    # The client-side checks of the public API.
    local = {
        "local_wrong_shape": lambda: kv.push(0, torch.zeros(n0 * num_slices + 5)),
        "local_unknown_key": lambda: kv.pull(999, torch.zeros(3)),
        "local_double_init": lambda: kv.init(0, torch.zeros(info.shape)),
        "local_bool_key": lambda: kv.push(True, torch.zeros(info.shape)),
    }
    for name, action in local.items():
        try:
            action()
            results[name] = {"outcome": "no error", "text": ""}
        except Exception as exc:
            results[name] = {"outcome": type(exc).__name__, "text": str(exc)}
    return results


def _mutations(templates: list[list[bytes]], rng: random.Random, count: int) -> list[list[bytes]]:
    """Random and mutated frame lists; never a well-formed reply (forged replies are a separate test)."""
    from geomx.protocol.wire import WireError, decode

    out: list[list[bytes]] = []
    while len(out) < count:
        choice = rng.random()
        if choice < 0.25:  # pure noise
            frames = [rng.randbytes(rng.randrange(0, 120)) for _ in range(rng.randrange(1, 5))]
        else:
            frames = [bytes(f) for f in rng.choice(templates)]
            how = rng.randrange(8)
            if how == 0:  # flip a few bytes of the header
                header = bytearray(frames[0])
                for _ in range(rng.randrange(1, 4)):
                    header[rng.randrange(len(header))] = rng.randrange(256)
                frames[0] = bytes(header)
            elif how == 1:  # truncate a frame
                index = rng.randrange(len(frames))
                frames[index] = frames[index][:rng.randrange(len(frames[index]) + 1)]
            elif how == 2:  # extend a frame
                index = rng.randrange(len(frames))
                frames[index] = frames[index] + rng.randbytes(rng.randrange(1, 40))
            elif how == 3:  # drop or duplicate a frame
                index = rng.randrange(len(frames))
                if rng.random() < 0.5 and len(frames) > 1:
                    del frames[index]
                else:
                    frames.insert(index, frames[index])
            elif how == 4:  # garbage body
                frames[1] = rng.choice([b"{", b"[1,2]", b"\xff\xfe", b'{"a":' + b"[" * 50, b"null",
                                        rng.randbytes(30)])
            elif how == 5:  # lie about the shape: huge, zero or many dimensions
                header = bytearray(frames[0])
                if len(header) >= 40:
                    header[-8:] = rng.choice([b"\xff" * 8, b"\x00" * 8, (1 << 40).to_bytes(8, "little")])
                frames[0] = bytes(header)
            elif how == 6:  # swap header and data
                frames.reverse()
            else:  # well-formed request from a stranger (not a client of the server)
                pass
        try:
            message = decode(frames)
            if message.is_reply:
                continue
        except WireError:
            pass
        except Exception:
            pass
        out.append(frames)
    return out


def fuzz(kv: Any, count: int, seed: int = 7) -> dict[str, Any]:
    """Send ``count`` junk frame lists from raw DEALER sockets to this worker's server(s) and schedulers.

    Returns {target label: {"address": ..., "frames": n, "bytes": payload bytes sent}}. All frames are
    handed to the network before this returns (the fuzz context is terminated with a linger).
    """
    import zmq

    from geomx.protocol.wire import Kind, Message, encode

    info = kv._keys[0]
    n0 = info.slices[0][1] - info.slices[0][0]
    templates = [
        encode(Message(Kind.PUSHPULL, key=0, slice=0, num_slices=len(info.slices), request_id=5,
                       tensor=np.ones(n0, np.float32))),
        encode(Message(Kind.PULL, key=0, request_id=6)),
        encode(Message(Kind.INIT, key=77, dtype=np.dtype(np.float32), shape=(4,), request_id=7)),
        encode(Message(Kind.INIT, key=78, tensor=np.ones((2, 3), np.float32), request_id=8)),
        encode(Message(Kind.BARRIER, request_id=9)),
        encode(Message(Kind.SHUTDOWN, request_id=10)),
        encode(Message(Kind.STATS, request_id=11)),
        encode(Message(Kind.CONFIGURE, request_id=12, body={"optimizer": {"name": "sgd", "params": {"lr": 5}}})),
        encode(Message(Kind.REGISTER, request_id=13, body={"role": "worker", "party": kv.party,
                                                           "address": "tcp://127.0.0.1:1", "rank": 0})),
    ]
    templates = [[bytes(memoryview(f)) for f in frames] for frames in templates]
    rng = random.Random(seed)
    targets = {f"server:{kv._requests.names.get(s, s)}": kv._van._peers[s].address for s in kv._servers}
    if kv.config.scheduler:
        targets["local_scheduler"] = f"tcp://{kv.config.scheduler}"
    targets["global_scheduler"] = f"tcp://{kv.config.global_scheduler}"
    context = zmq.Context()
    report: dict[str, Any] = {}
    sockets = {}
    for label, address in targets.items():
        sock = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 20_000)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.connect(address)
        sockets[label] = sock
        report[label] = {"address": address, "frames": 0, "bytes": 0}
    frames_list = _mutations(templates, rng, count)
    started = time.monotonic()
    for index, frames in enumerate(frames_list):
        label = list(targets)[index % len(targets)]
        sockets[label].send_multipart(frames)
        report[label]["frames"] += 1
        report[label]["bytes"] += sum(len(f) for f in frames)
    for sock in sockets.values():
        sock.close()
    context.term()  # returns once every frame was handed to the peers (or the linger ran out)
    report["seconds"] = time.monotonic() - started
    return report


def forge_replies(kv: Any, rounds: int, max_request_id: int = 400) -> dict[str, Any]:
    """As a stranger, answer request ids 1..max_request_id of this worker's server with forged ERROR replies.

    A server must only accept a reply from the peer it asked; replies from anyone else must be dropped.
    """
    import zmq

    from geomx.protocol.wire import Flag, Kind, Message, encode

    address = kv._van._peers[kv._servers[0]].address
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 20_000)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.connect(address)
    sent = 0
    for _ in range(rounds):
        for request_id in range(1, max_request_id + 1):
            forged = Message(Kind.ERROR, request_id=request_id, flags=Flag.REPLY, body={"error": "forged"})
            sock.send_multipart([bytes(memoryview(f)) for f in encode(forged)])
            sent += 1
    sock.close()
    context.term()
    return {"address": address, "sent": sent}


def poison(kv: Any, depth: int = 100_000) -> dict[str, Any]:
    """As a stranger, send this worker's server one message whose JSON body nests ``depth`` arrays.

    The body is under the 1 MiB limit, so the receiver must reject it as a malformed message and go on.
    """
    import zmq

    from geomx.protocol.wire import Kind, Message, encode

    address = kv._van._peers[kv._servers[0]].address
    header = bytes(memoryview(encode(Message(Kind.STATS))[0]))
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 20_000)
    sock.connect(address)
    sock.send_multipart([header, b"[" * depth])
    sock.close()
    context.term()
    return {"address": address, "depth": depth}


# -- checks (run in the test process) -------------------------------------------------------------------

def assert_fsa_equivalent(workers: dict[int, tuple[dict[str, list[torch.Tensor]], dict[str, Any]]],
                          num_workers: int, steps: int = STEPS, clip: float | None = None) -> None:
    """Every worker holds the single-process reference weights (its gradients clipped to ``clip``), and all
    workers hold the same bits."""
    assert sorted(workers) == list(range(num_workers)), f"outputs from ranks {sorted(workers)}"
    initial, final = reference_run(num_workers, steps, clip=clip)
    master = workers[0][0]
    for a, b in zip(master["before_init"], initial, strict=True):
        assert torch.equal(a, b), "the master's own initial weights differ from the reference's"
    for rank, (tensors, report) in workers.items():
        assert report["global_rank"] == rank
        if rank != 0:  # the seeds differ on purpose: init is what makes the weights equal
            assert any(not torch.equal(a, b) for a, b in zip(tensors["before_init"], initial, strict=True)), rank
        for a, b in zip(tensors["after_init"], initial, strict=True):
            assert torch.equal(a, b), f"worker {rank} does not hold the master's weights after init"
        for a, b in zip(tensors["final"], master["final"], strict=True):
            assert torch.equal(a, b), f"worker {rank} ended with weights different from worker 0's"
    for index, (got, want, start) in enumerate(zip(master["final"], final, initial, strict=True)):
        assert not torch.allclose(got, start), f"parameter {index} did not change: nothing was trained"
        torch.testing.assert_close(got, want, msg=lambda m, i=index: f"parameter {i} differs from the "
                                                                      f"single-process reference: {m}")


def assert_one_trained_model(workers: dict[int, tuple[dict[str, list[torch.Tensor]], dict[str, Any]]],
                             mode: str) -> None:
    """Every worker ran the wrapper in ``mode`` and ended with worker 0's final weights, which training changed."""
    master = workers[0][0]
    for rank, (tensors, report) in workers.items():
        assert report["mode"] == mode, (rank, report["mode"])
        for got, want, start in zip(tensors["final"], master["final"], master["after_init"], strict=True):
            assert torch.equal(got, want), f"worker {rank} ended with another model"
            assert not torch.equal(got, start), f"worker {rank}: a parameter did not change"


def dcasgd_order(parties: dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray]]], lr: float, lamda: float,
                 what: str) -> tuple[list[str], list[bool]]:
    """The order in which a global server applied the parties' pushes of one slice under DCASGD, rebuilt from what
    each party recorded per step: (the weights it computed on, its gradient as the server scales it, the weights
    it received). At every point exactly one party's next push must turn the current weights into what that party
    received, by ``w - lr * (g + lamda * g * g * (w - w_bak))`` with ``w_bak`` the weights that party held (one
    backup per party, seeded with the INIT weights). Also returns, per push, whether plain SGD (no compensation)
    would explain it too."""
    starts = [steps[0][0] for steps in parties.values()]
    for start in starts[1:]:  # every party started from the master's weights
        np.testing.assert_array_equal(start, starts[0])
    w, position, order, plain_fits = starts[0], dict.fromkeys(parties, 0), [], []
    while any(i < len(parties[p]) for p, i in position.items()):
        matches = []
        for party, i in position.items():
            if i == len(parties[party]):
                continue
            held, g, got = parties[party][i]
            if np.allclose(w - lr * (g + lamda * g * g * (w - held)), got, rtol=1e-5, atol=1e-6):
                matches.append((party, got, np.allclose(w - lr * g, got, rtol=1e-5, atol=1e-6)))
        assert len(matches) == 1, (f"{what} after {order}: {len(matches)} parties' next push explain the weights "
                                   "they received (want exactly one)")
        party, w, plain = matches[0]
        order.append(party)
        plain_fits.append(plain)
        position[party] += 1
    return order, plain_fits


def assert_every_push_applied_once(workers: dict[int, tuple[dict[str, list[torch.Tensor]], dict[str, Any]]]) -> None:
    """Plain SGD on the global server: every worker ends at ``initial - LR * (sum of every worker's pushes)``,
    each push applied exactly once (none lost, none twice), whatever order they arrived in."""
    initial = workers[0][0]["initial"]
    total_pushed = [sum(workers[r][0]["pushed"][i] for r in workers) for i in range(len(initial))]
    expected = [w0 - LR * g for w0, g in zip(initial, total_pushed, strict=True)]
    for rank, (tensors, _) in workers.items():
        for got, want in zip(tensors["final"], expected, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=f"worker {rank}")


class SurvivorSteps:
    """A worker's steps: ``steps`` of them, or, with ``until_file``, steps until that file exists (at most
    ``max_steps``) and ``after`` more: a survivor trains on until a restarted party says it rejoined. Iterating
    raises if the file never appeared. ``total`` is the most steps it can take (for ``make_data``).

    Usage: ``for step in SurvivorSteps(args.steps, args.until_file, args.max_steps, args.after): ...``
    """

    def __init__(self, steps: int, until_file: str | None, max_steps: int, after: int) -> None:
        self.until_file = until_file
        self.after = after
        self.total = steps if not until_file else max_steps + after

    def __iter__(self) -> Iterator[int]:
        stop_at = self.total
        for step in range(self.total):
            if step >= stop_at:
                return
            if self.until_file and stop_at == self.total and Path(self.until_file).exists():
                stop_at = step + self.after
            yield step
        if self.until_file and stop_at == self.total:
            raise RuntimeError(f"{self.until_file} did not appear within {self.total - self.after} steps")


def run_and_exit(main: Callable[[], None]) -> None:
    """Run a worker's ``main``, then end the process without the interpreter's teardown.

    Every worker here imports torch, and freeing its modules at exit costs about 0.35 CPU-s a process (hundreds
    of processes per suite) and nothing a test reads: by then the worker closed its kvstore or wrapper and wrote
    its outputs. An exception in ``main`` still ends the usual way (a traceback, exit status 1).
    """
    main()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
