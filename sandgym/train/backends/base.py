"""The inference-backend interface the trainer uses.

Generation always goes through an OpenAI-compatible HTTP endpoint (`base_url`), the same way
environments reach any model server; the backend's own job is to serve that endpoint and to
receive new weights after each optimizer step.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class InferenceBackend(Protocol):
    name: str  # "hf" or "vllm"
    model_name: str  # what clients pass as `model`

    @property
    def base_url(self) -> str:  # e.g. http://127.0.0.1:PORT/v1
        ...

    def start(self) -> None: ...

    def update_weights(self, model: torch.nn.Module) -> None:
        """Make the served model equal to the trainer's `model` (called after each step)."""
        ...

    def sleep(self) -> None:
        """Free accelerator memory for training (no-op where not supported)."""
        ...

    def wake(self) -> None: ...

    def close(self) -> None: ...
