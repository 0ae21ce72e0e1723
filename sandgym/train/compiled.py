"""Decoder layers compiled for training, run eagerly where a thread decodes.

`model.compile_layers` compiles each decoder layer for the trainer's packed micro-batches
(docs/training.md). A transformers backend that shares the model object (the `hf` backend,
`share_weights`) calls the same layers with a KV cache, and under torch.compile each new
state of that cache is a recompile: one greedy generation of a 2-layer model recompiled six
times (grad mode, each layer's cache being initialised, the cache's strides, the layer
index). The layer index is an integer attribute, static to dynamo, so a real model's every
layer would add one (not run here: a 24-layer model would pass dynamo's recompile limit of 8
and fall back to eager anyway). That generation cost 15 CPU-s on this CPU with inductor's
cache warm. So decoding runs the layers eagerly: `eager_layers()`, per thread, while the
trainer's step in another thread keeps its compiled layers.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

from sandgym.train.logprobs import decoder

_here = threading.local()  # .eager: this thread runs compiled layers eagerly


class CompiledForward:
    """A layer's `forward`, compiled with dynamic shapes (packed lengths vary per
    micro-batch), or as it was in a thread inside `eager_layers()`."""

    def __init__(self, forward: Callable[..., Any]) -> None:
        self.eager = forward
        self.compiled = torch.compile(forward, dynamic=True)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        run = self.eager if getattr(_here, "eager", False) else self.compiled
        return run(*args, **kwargs)


def compile_layers(model: torch.nn.Module) -> None:
    """Compile each decoder layer's forward in place. Layers, not the whole model: the LM
    head stays outside the graph, so the fused heads run as they are; inside, the sdpa
    kernel's packed attention runs eagerly (attention.py), the flash kernels are left to
    dynamo."""
    for layer in decoder(model).layers:
        if not isinstance(layer.forward, CompiledForward):
            layer.forward = CompiledForward(layer.forward)


@contextlib.contextmanager
def eager_layers() -> Iterator[None]:
    """Layers compiled by `compile_layers` run eagerly in this thread meanwhile."""
    before = getattr(_here, "eager", False)
    _here.eager = True
    try:
        yield
    finally:
        _here.eager = before
