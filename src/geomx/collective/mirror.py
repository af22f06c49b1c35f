"""Host mirrors: how a collective rank's owned slices cross between the model's device and the host, where the
WAN codecs, the sockets and HFA's numpy arithmetic read them.

One round machine (``geomx.algorithms.hfa.machine``) runs every global round of a collective party; the device
differs only in its mirror:

- ``InPlaceMirror`` (a model on the CPU): host *is* the device. A leaving slice is read in place (a blocking round
  computes its delta straight from the model), or, where the model trains on while the round is out, copied on a
  copier thread; the slices' global models are the job model's own ranges (``copies`` False).
- ``StagedMirror`` (the CPU, ``training.staged: true``): separate host buffers, filled and emptied by the
  copier thread as the CUDA mirror's side stream does: the GPU's shape of the path, runnable (and tested bit for
  bit against the in-place one) on a machine without a GPU.
- ``CudaMirror``: page-locked host buffers; each copy runs on a side stream after the compute stream's work so far,
  and an event says when it is done, so ``opt.step()`` never waits for a copy that could overlap compute.

Usage::

    mirror = mirror_for(params[0].device, staged=False)
    host = mirror.host(numel, torch.float32)                 # a host buffer (pinned on CUDA)
    copy = mirror.down(sources, pieces); ...; copy.wait()    # device ranges -> host pieces
    mirror.up(pieces, targets).wait()                        # host pieces -> device ranges
    with mirror.side(): ...                                  # a trip thread's device work (its stream on CUDA)
    mirror.hand_over()                                       # the compute stream waits for the trips' work
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

import torch


class Copy(Protocol):
    """A copy started by a mirror; ``wait`` returns once its target holds the values (raising what it raised)."""

    def wait(self) -> None: ...


class Done:
    """A copy that finished when it started (or needed none)."""

    def wait(self) -> None:
        return None


class _Threaded:
    """A copy on the copier thread."""

    def __init__(self, future: Future[None]) -> None:
        self.future = future

    def wait(self) -> None:
        self.future.result()


class HostMirror(Protocol):
    """The moves between the model's device and the host that a collective rank's global rounds need."""

    copies: bool  # whether host buffers are apart from the device's tensors (False: the device is the host)

    def host(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A host buffer of ``numel`` elements (zeroed: resident before the first round needs it)."""
        ...

    def down(self, sources: Sequence[torch.Tensor], pieces: Sequence[torch.Tensor]) -> Copy:
        """Start copying each device range of ``sources`` into its host piece."""
        ...

    def up(self, pieces: Sequence[torch.Tensor], targets: Sequence[torch.Tensor]) -> Copy:
        """Start copying each host piece into its device range of ``targets``."""
        ...

    def side(self) -> contextlib.AbstractContextManager[None]:
        """The context of a trip thread's device work (the side stream on CUDA)."""
        ...

    def hand_over(self) -> None:
        """Order the device work the trips queued before the compute stream's next work."""
        ...

    def close(self) -> None:
        """Stop the copier thread, if any."""
        ...


def _copy_all(sources: Sequence[torch.Tensor], pieces: Sequence[torch.Tensor]) -> None:
    for source, piece in zip(sources, pieces, strict=True):
        piece.copy_(source)


class InPlaceMirror:
    """A model on the CPU: host buffers are plain tensors; copies run on the copier thread."""

    copies = False

    def __init__(self) -> None:
        self.copier = ThreadPoolExecutor(max_workers=1, thread_name_prefix="geomx-mirror")

    def host(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.zeros(numel, dtype=dtype)

    def down(self, sources: Sequence[torch.Tensor], pieces: Sequence[torch.Tensor]) -> Copy:
        return _Threaded(self.copier.submit(_copy_all, list(sources), list(pieces)))

    def up(self, pieces: Sequence[torch.Tensor], targets: Sequence[torch.Tensor]) -> Copy:
        _copy_all(pieces, targets)  # the caller's thread: nothing to overlap on the CPU
        return Done()

    def side(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def hand_over(self) -> None:
        return None

    def close(self) -> None:
        self.copier.shutdown(wait=True)


class StagedMirror(InPlaceMirror):
    """The CPU with the GPU's shape: host buffers apart from the model, both directions on the copier thread."""

    copies = True

    def up(self, pieces: Sequence[torch.Tensor], targets: Sequence[torch.Tensor]) -> Copy:
        return _Threaded(self.copier.submit(_copy_all, list(pieces), list(targets)))


class _Event:
    """A CUDA copy: its event, waited for on the host."""

    def __init__(self, event: torch.cuda.Event) -> None:
        self.event = event

    def wait(self) -> None:
        self.event.synchronize()


class CudaMirror:
    """A model on a GPU: pinned host buffers, copies on a side stream ordered after the compute stream's work."""

    copies = True

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device=device)

    def host(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.zeros(numel, dtype=dtype, pin_memory=True)

    def _on_side(self, sources: Sequence[torch.Tensor], targets: Sequence[torch.Tensor]) -> Copy:
        self.stream.wait_stream(torch.cuda.current_stream(self.device))  # after what the compute stream queued
        with torch.cuda.stream(self.stream):
            for source, target in zip(sources, targets, strict=True):
                target.copy_(source, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.stream)
        return _Event(event)

    def down(self, sources: Sequence[torch.Tensor], pieces: Sequence[torch.Tensor]) -> Copy:
        return self._on_side(sources, pieces)

    def up(self, pieces: Sequence[torch.Tensor], targets: Sequence[torch.Tensor]) -> Copy:
        return self._on_side(pieces, targets)

    @contextlib.contextmanager
    def side(self) -> Iterator[None]:
        with torch.cuda.stream(self.stream):
            yield

    def hand_over(self) -> None:
        torch.cuda.current_stream(self.device).wait_stream(self.stream)

    def close(self) -> None:
        self.stream.synchronize()


def mirror_for(device: torch.device, staged: bool = False) -> HostMirror:
    """The mirror of a model on ``device``: CUDA's; on the CPU in place, or ``staged`` (the GPU's shape)."""
    if device.type == "cuda":
        return CudaMirror(device)
    return StagedMirror() if staged else InPlaceMirror()
