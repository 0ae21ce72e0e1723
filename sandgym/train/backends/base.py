"""The inference seams of training: the engine and the inference backend.

Generation always goes through an OpenAI-compatible HTTP endpoint (`base_url`), the same way
environments reach any model server. An `InferenceEngine` turns token ids into sampled token
ids and their logprobs; `openai_server.OpenAIServer` puts any engine behind that endpoint. An
`InferenceBackend` (hf.HFBackend, vllm.VLLMBackend) owns an engine and its server, and
receives new weights after each optimizer step.

This module imports nothing beyond torch: the device image runs the engines without the
HTTP stack.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch


@dataclass
class GenRequest:
    prompt_ids: list[int]
    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False


@dataclass
class GenResult:
    completion_ids: list[int]
    logprobs: list[float]  # the sampled tokens' raw (temperature 1) logprobs
    finish_reason: str  # "stop" | "length"


@runtime_checkable
class InferenceEngine(Protocol):
    """Token ids in, token ids and logprobs out (hf.HFEngine, vllm.VLLMEngine)."""

    tokenizer: Any  # a transformers tokenizer: the server renders chats and decodes text with it
    max_batch_size: int  # the most requests the server hands to one `generate` call

    def generate(self, reqs: list[GenRequest]) -> list[GenResult]:
        """One result per request, in order (thread-safe: the server calls it from a worker)."""
        ...


@runtime_checkable
class InferenceBackend(Protocol):
    """What the trainer drives: start, generation through `base_url`, a weight push after
    each optimizer step, sleep around training, close."""

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
