"""The wrapper's hooks on the model: which layer each parameter is in (its priority), what each module's forward
waits for (P3's overlap), and a hook that copies of the model drop and ``torch.compile`` never traces.

A model compiled with ``torch.compile`` is trained through the module it wraps (``uncompiled``): the same parameter
names as without compiling (a checkpoint's keys do not depend on it), the same per-module waits. Dynamo meets those
hooks inside the compiled forward and runs them eagerly (``_eager``: a graph break each), never tracing the store's
pulls, sockets and futures into the graph (it tried, recompiling each hook up to its limit). The breaks also keep
torch 2.13 inductor's CPU backward of a conv-ReLU-conv-ReLU-MaxPool2d-Linear-ReLU-Linear stack right: compiled
whole, it gives every layer before the pool a zero gradient (with or without geomx; docs/pytorch.md).

Usage (``DistributedOptimizer``'s setup)::

    model, compiled = uncompiled(model)                 # compiled: the torch.compile wrapper, or None
    layers, waits = layer_of_params(model, params)     # priority -layer; waits: module -> keys
    module.register_forward_pre_hook(Hook(functools.partial(before_forward, waits[module])))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch._dynamo.eval_frame import OptimizedModule

# Modules that only hold others and never use their children's parameters themselves.
_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)


def layer_of_params(model: nn.Module, params: list[nn.Parameter]) -> tuple[list[int], dict[nn.Module, list[int]]]:
    """Layer index per parameter (modules in definition order) and what each module's forward waits for.

    The root and pure containers wait for their own parameters only; any other module waits for its whole
    subtree, because its forward may use a child's parameters without calling the child (PyTorch's
    attention uses ``out_proj.weight`` directly; its fused inference path skips every child).
    """
    index_of = {id(p): i for i, p in enumerate(params)}
    layers = [0] * len(params)
    seen: set[int] = set()
    waits: dict[nn.Module, list[int]] = {}
    layer = 0
    for module in model.modules():
        own = [index_of[id(p)] for p in module.parameters(recurse=False) if id(p) in index_of]
        own = [k for k in own if k not in seen]  # a shared tensor belongs to its first owner
        if own:
            seen.update(own)
            for key in own:
                layers[key] = layer
            layer += 1
        recurse = not (module is model or isinstance(module, _CONTAINERS))
        keys = sorted({index_of[id(p)] for p in module.parameters(recurse=recurse) if id(p) in index_of})
        if keys:
            waits[module] = keys
    return layers, waits


def uncompiled(model: nn.Module) -> tuple[nn.Module, nn.Module | None]:
    """The module ``torch.compile`` wraps (``model`` itself if not compiled), and the compiled wrapper or None.
    Usage: ``model, compiled = uncompiled(torch.compile(net))`` -> ``(net, <OptimizedModule>)``"""
    if isinstance(model, OptimizedModule):
        inner = model._orig_mod
        assert isinstance(inner, nn.Module), "torch.compile wraps a module"
        return inner, model
    return model, None


@torch.compiler.disable(recursive=True)
def _eager(function: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """``function(*args)`` outside any compiled graph (Dynamo breaks the graph here and runs it as Python)."""
    return function(*args)


def _detached(*args: Any) -> None:
    """What a copy of the model gets in place of a wrapper's hook: nothing."""


class Hook:
    """A hook of the wrapper's on the model. A deepcopy (an evaluation copy, say) or a pickle of the model gets
    ``_detached`` in its place: the copy is not wrapped, and the wrapper's store and sockets are not copied. Under
    ``torch.compile`` it runs eagerly, never traced (``_eager``)."""

    def __init__(self, function: Callable[..., Any]) -> None:
        self.function = function

    def __call__(self, *args: Any) -> Any:
        return _eager(self.function, args)

    def __deepcopy__(self, memo: dict[int, Any]) -> Callable[..., None]:
        return _detached

    def __reduce__(self) -> tuple[Any, ...]:
        return _copied_hook, ()


def _copied_hook() -> Callable[..., None]:
    return _detached
