"""The worker-side seam of the PyTorch wrapper: one strategy object per algorithm, over the wrapper's mechanism.

``geomx.torch.DistributedOptimizer`` is mechanism only: it registers hooks, tracks which parameters have
answers on their way, lands them before the forward that needs them, records metrics. What a ``step()`` does
under the configured algorithm is a ``WorkerStrategy``'s: the wrapper holds one, chosen once by the plan, and
calls it without asking which it holds (as torchft's ``LocalSGD`` and ``DiLoCo`` are small classes over its
``Manager``). A strategy overrides only the part that differs from its parent; the strategies live in their
algorithms' folders (``geomx/algorithms/<name>/strategy.py``) and ``geomx.algorithms.registry.STRATEGIES``
names them, by the plan's mode and the party's LAN tier (``geomx.algorithms.modes``).

Usage::

    class MyAverage(PeriodicAverage):
        def sync(self, finishing: bool) -> None:
            ...                                  # what differs from the parent's periodic average
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from .ranks import PartyRanks, Store

if TYPE_CHECKING:  # the servers never import torch; only the wrapper's strategies use it at run time
    import torch

# Keys of the wrapper's own bookkeeping, far above any parameter index: the model's signature, then one
# key per strategy that needs one of its own (a control key, say).
WRAPPER_KEYS = 1 << 40
SIGNATURE_KEY = WRAPPER_KEYS
# The job's step, as the master worker INITs it (0, or its own checkpoint's step on --resume): a resumed global
# server whose checkpoint holds the model answers this key's INIT with its checkpoint's step instead
# (geomx.core.checkpoints), so every worker learns where the job goes on. Never pushed.
STEP_KEY = WRAPPER_KEYS + 2


class Loop(Protocol):
    """What the wrapper offers its strategy: the store, the party's ranks, the model's tensors and the bookkeeping of
    answers."""

    kv: Store  # the worker's geomx.kv.KVStore
    ranks: PartyRanks | None  # a collective party's ranks (geomx.worker.ranks); None in a party with a local server
    optimizer: torch.optim.Optimizer
    params: Sequence[torch.nn.Parameter]
    names: Sequence[str]  # each parameter's name in the model
    trained: Sequence[int]  # keys of the parameters the optimizer trains
    priority: Sequence[int]  # each key's send priority
    pending: set[int]  # keys whose answers are on their way (landed lazily, before the forward needing them)
    pushed: set[int]  # keys pushed during this step's backward
    ddp: Any  # the script's DistributedDataParallel around the model (a collective party's), or None
    steps_done: int  # the job's steps completed (from its start step)
    tokens: int | None  # the samples (tokens) the script counted since the strategy last took them (None: none)

    def await_keys(self, keys: Sequence[int]) -> None:
        """Land the answers of ``keys`` still on their way."""

    def synchronize(self) -> None:
        """Land every answer still on its way."""

    def waited(self, seconds: float) -> None:
        """Count ``seconds`` spent waiting for the network in this step."""

    def warn_once(self, tag: str, text: str) -> None:
        """Log ``text`` once per ``tag``."""

    def update(self) -> None:
        """The wrapped optimizer's step on ``.grad``, unless a GradScaler found them not finite this step (then the
        update is skipped, and the algorithm's schedule goes on as if it had run). This step's own state is then
        final: the worker's checkpoint of it is written here when due, before anything the strategy sends next (so
        the global servers never complete a round whose workers' checkpoints are missing)."""


class WorkerStrategy:
    """What one ``step()`` of the wrapped loop does under an algorithm. This base does nothing: subclasses
    override the parts that differ.

    ``pushes_gradients``: the wrapper pushes each gradient from an autograd hook as backward produces it
    (``on_gradient``); otherwise gradients stay local and ``step`` decides what travels.
    """

    pushes_gradients = False
    # the global servers' values are not the model (gradient sums): the workers' checkpoints hold it, with the
    # optimizer state; otherwise a worker's checkpoint holds only its optimizer's state (geomx.torch.checkpoint)
    keeps_model = False
    # under a synchronous sync policy, every party holds the same model at the start of each step once every answer
    # on its way has landed (the status page compares their digests: geomx.torch.digest); see ``common_model_step``
    same_model_everywhere = False

    def __init__(self, loop: Loop) -> None:
        self.loop = loop

    def init_keys(self) -> None:
        """After the model's keys are initialized: initialize the strategy's own keys, if any."""

    def steps_of(self, rounds: int) -> int | None:
        """The training steps ``rounds`` completed global rounds stand for (a resumed job's step from its global
        servers' checkpoint); None where rounds do not tell steps. This base: one round a step (FSA)."""
        return rounds

    def checkpoint_number(self, step: int) -> int | None:
        """The number this worker's checkpoint of its state after ``step`` goes by: the step itself where rounds tell
        steps (``steps_of``); where they do not (each worker's own steps per round, say), the global rounds
        completed once this step's round is, the number of the global servers' checkpoint it pairs with, and None
        for a step that ends no round (no checkpoint then). This base: ``step``."""
        return step

    def resumes_behind(self) -> bool:
        """Whether this worker's party may be behind its global servers' rounds (they went on without it): on
        ``--resume`` it then takes its newest checkpoint at or before their step, and goes on from its own step.
        This base: False (every round waits for every party)."""
        return False

    def common_model_step(self) -> int | None:
        """The job's step whose model this worker holds at the start of ``step()`` (once every answer on its way has
        landed) where, under a synchronous sync policy, every party holds that same model; None where it holds a
        model of its own then (between global rounds) or never one every party holds. This base: every step's
        (``loop.steps_done``) where the strategy declares ``same_model_everywhere``, else None."""
        return self.loop.steps_done if self.same_model_everywhere else None

    def on_gradient(self, key: int, grad: torch.Tensor) -> None:
        """A gradient is ready (only with ``pushes_gradients``): push it."""
        loop = self.loop
        loop.kv.push(key, grad, priority=loop.priority[key])
        loop.pushed.add(key)

    def step(self) -> None:
        """One training step, after backward."""

    def average_gradients(self) -> None:
        """Every trained parameter's ``.grad`` = the gradient this step's optimizer will apply, before ``step`` (to
        clip or read it), as DDP leaves it after backward; ``step`` then applies it as it is. This base: the
        gradients are this worker's own as backward left them (local SGD's inner steps), nothing to do."""

    def inner_step(self) -> None:
        """The step's own math once backward is done: the wrapped optimizer (a strategy that averages the party's
        gradients every step does that here too). Periodic strategies call it from ``step``, so an accelerator
        stand-in (``geomx.bench.standin``: a wait, where a GPU would compute) can take its place without
        touching the sync around it."""
        self.loop.update()

    def finish(self) -> None:
        """The loop ends (``close``): what the algorithm owes the job before the worker leaves."""

    def load_job_model(self, into: Sequence[torch.Tensor]) -> None:
        """Write the job's model into ``into`` (tensors shaped as the parameters). This base: every answer is the
        job's model, so it is this worker's, once every answer on its way has landed."""
        loop = self.loop
        loop.synchronize()
        for out, param in zip(into, loop.params, strict=True):
            out.copy_(param.data)


class AveragedStep(WorkerStrategy):
    """A strategy whose step applies a mean gradient it makes (``average``) once a step: asked for by the script
    (``average_gradients``, to clip it, say) or by ``step``, which then runs the wrapped optimizer on it.

    Usage::

        class LocalMean(AveragedStep, SomeStrategy):
            def average(self) -> None: ...      # every .grad = the mean the step applies

    A strategy whose ``step`` is its own calls ``take_average`` where it applies the mean.
    """

    averaged = False  # this step's mean is in .grad already

    def step(self) -> None:
        self.take_average()
        self.inner_step()

    def take_average(self) -> None:
        """This step's mean in ``.grad`` (made now unless ``average_gradients`` made it); the next step makes its
        own."""
        self.average_gradients()
        self.averaged = False

    def average_gradients(self) -> None:
        if not self.averaged:
            self.average()
            self.averaged = True

    def average(self) -> None:
        """Every trained parameter's ``.grad`` = the mean gradient this step applies."""
        raise NotImplementedError
